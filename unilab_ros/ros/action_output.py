"""The ``action`` publisher of the trainer and the policy node, and its message type."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rclpy.lifecycle import LifecycleNode
from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_msgs.msg import Float32MultiArray, Float64MultiArray

from unilab_ros.ros.messages import to_float32_msg, to_float64_msg
from unilab_ros.ros.qos import overridable

ACTION_MSG_TYPES = ("float32", "float64")


@dataclass
class ActionOutputConfig:
    """How actions go out."""

    action_msg_type: str = "float32"
    """float32 (std_msgs/Float32MultiArray) or float64 (Float64MultiArray, as
    ros2_control's forward_command_controller takes)."""

    def validate(self) -> None:
        if self.action_msg_type not in ACTION_MSG_TYPES:
            raise ValueError(f"action_msg_type must be one of {ACTION_MSG_TYPES}")


class CommandPublisher:
    """A node's command publisher: a lifecycle node's sends only while the node is active.
    ``ActionOutput`` and the robot spec's ``robot_link.JointCommandOutput`` publish through
    it."""

    def __init__(self, node: Node, message_type: type, topic: str, qos: QoSProfile) -> None:
        self._node = node
        self._lifecycle = isinstance(node, LifecycleNode)
        create = node.create_lifecycle_publisher if self._lifecycle else node.create_publisher
        self.message_type = message_type
        self._publisher = create(message_type, topic, qos, qos_overriding_options=overridable())

    @property
    def topic_name(self) -> str:
        """The resolved topic name (namespace and remaps applied)."""
        return self._publisher.topic_name

    def destroy(self) -> None:
        if self._lifecycle:
            self._node.destroy_lifecycle_publisher(self._publisher)
        else:
            self._node.destroy_publisher(self._publisher)


class ActionOutput(CommandPublisher):
    """Publishes (num_envs, action_dim) commands on ``topic`` in the configured type."""

    def __init__(
        self, node: Node, cfg: ActionOutputConfig, qos: QoSProfile, topic: str = "action"
    ) -> None:
        float64 = cfg.action_msg_type == "float64"
        self._to_msg = to_float64_msg if float64 else to_float32_msg
        self.dtype = np.float64 if float64 else np.float32
        """What one element of a published command is on the wire."""
        super().__init__(node, Float64MultiArray if float64 else Float32MultiArray, topic, qos)

    def wire(self, command: np.ndarray) -> bytes:
        """The data ``publish`` sends for ``command``, as bytes (to tell one's own commands
        from a rival's)."""
        return np.ascontiguousarray(command, self.dtype).tobytes()

    @staticmethod
    def received(msg: Float32MultiArray | Float64MultiArray) -> bytes:
        """The data of a command message heard on the topic, as bytes."""
        return bytes(memoryview(msg.data))

    def publish(self, command: np.ndarray) -> None:
        self._publisher.publish(self._to_msg(command, ("env", "action")))
