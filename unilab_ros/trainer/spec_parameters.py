"""The parameters a robot spec decides, as the node reports them (ROS-free).

With a robot spec the sizes, the action mapping and the command message are the spec's,
whatever the params file says; the node writes these values back into its parameters so
``ros2 param get`` / ``dump`` show what runs, and a dump used as a params file starts the
same run (``session.with_robot_spec`` takes these values back without a note).
"""

from __future__ import annotations

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.spec_types import RobotSpec


def shown_actions(spec: RobotSpec) -> ActionConfig:
    """The spec's mapping in command units, what an operator measures at the robot: scale,
    limits and safe command per joint (a position interface adds the default pose to
    scale x action first)."""
    joints = JointCommands(spec)
    return ActionConfig(action_scale=joints.scale.tolist(), action_low=joints.low.tolist(),
                        action_high=joints.high.tolist(), safe_action=joints.safe.tolist())


def shown_msg_type(spec: RobotSpec) -> str | None:
    """``action_msg_type`` of the spec's command message (None: a JointTrajectory, which
    that parameter does not name)."""
    return "float64" if spec.actions.output == "float64_multi_array" else None
