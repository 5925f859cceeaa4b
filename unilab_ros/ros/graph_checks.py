"""Who else commands the robot: another node of this node's name, or another publisher of
its action topic (two trainers in one namespace corrupt each other's steps silently).

The ROS graph names them, but also keeps a killed process's node and publishers for a
while (until DDS's lease on it runs out, 20 s with Fast DDS's defaults): a trainer
restarted after a crash would take its own ghost for a rival. So a rival counts only
while commands that are not this node's own arrive on its action topics.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from unilab_ros.ros.action_output import ActionOutput
from unilab_ros.ros.spec_link import JointCommandOutput

LIVE_WINDOW = 2.0
"""Seconds a foreign command keeps the rival that sent it counted as live."""
UNNAMED_MIN_COMMANDS = 10
"""Foreign commands within ``LIVE_WINDOW`` that make a rival of a publisher the graph does
not name: a rival commands a robot steadily (10 is 0.2 s of a 50 Hz trainer), while a lone
stray sample (seen once in CI, from a publisher the graph never named) must not stop
training."""

CommandOutput = ActionOutput | JointCommandOutput
"""What sends a node's commands: the topic contract's arrays, or a robot spec's joints."""
UNKNOWN_NODE = "_NODE_NAME_UNKNOWN_"
"""The node name the graph gives an endpoint whose node it does not know."""


def _qualified(name: str, namespace: str) -> str:
    return f"{namespace.rstrip('/')}/{name}"


def rivals(node: Node, topics: list[str]) -> list[str]:
    """One line for each: another node named like ``node``, and each of ``topics`` that
    other nodes publish too (``node`` publishes each of them once), naming them."""
    me = _qualified(node.get_name(), node.get_namespace())
    lines = []
    twins = sum(1 for name, namespace in node.get_node_names_and_namespaces()
                if _qualified(name, namespace) == me)
    if twins > 1:
        lines.append(f"another node is named {me}")
    for topic in topics:
        # An endpoint whose node is gone (destroyed, its process killed) can linger with
        # no node name until DDS drops it: it commands nothing.
        publishers = [_qualified(info.node_name, info.node_namespace)
                      for info in node.get_publishers_info_by_topic(topic)
                      if info.node_name != UNKNOWN_NODE]
        if me in publishers:
            publishers.remove(me)
        if publishers:
            lines.append(f"{topic} is also published by {', '.join(sorted(set(publishers)))}")
    return lines


class RivalWatch:
    """Publishes a node's commands and tells whether another node sends some too.

    It listens on its own action topics while told to (``listen_for`` seconds from the
    start: a newcomer's own check) and while the graph names rivals; commands it sent
    itself come back there too and are told apart by their bytes. ``on_foreign`` is
    called on each command of another node, so a rival's first commands are acted on at
    once rather than at the caller's next periodic ``check``.
    """

    def __init__(
        self, node: Node, outputs: list[CommandOutput], listen_for: float,
        on_foreign: Callable[[], None] | None = None,
    ) -> None:
        self._node = node
        self._on_foreign = on_foreign
        self._outputs = outputs
        # Best effort hears reliable and best-effort publishers alike.
        self._qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
        self._own: deque[bytes] = deque(maxlen=64)
        self._foreign: deque[float] = deque(maxlen=UNNAMED_MIN_COMMANDS)
        self._listen_until = time.monotonic() + listen_for
        self._subscriptions: list[Any] = []
        self._listen(True)

    def publish(self, r: int, command: np.ndarray) -> None:
        output = self._outputs[r]
        if self._subscriptions:
            self._own.append(output.wire(command))
        output.publish(command)

    def check(self) -> list[str]:
        """The live rivals, one line each (none while no foreign command arrived lately)."""
        found = rivals(self._node, [output.topic_name for output in self._outputs])
        now = time.monotonic()
        self._listen(bool(found) or now < self._listen_until)
        recent = sum(1 for heard in self._foreign if now - heard <= LIVE_WINDOW)
        if found and recent:
            return found
        if recent >= UNNAMED_MIN_COMMANDS:
            return ["commands arrive from a publisher the ROS graph does not name yet"]
        return []

    def close(self) -> None:
        """Stop listening (the outputs stay the caller's)."""
        self._listen(False)

    def _listen(self, on: bool) -> None:
        if on and not self._subscriptions:
            self._subscriptions = [
                self._node.create_subscription(
                    output.message_type, output.topic_name,
                    lambda msg, output=output: self._heard(output.received(msg)), self._qos)
                for output in self._outputs
            ]
        elif not on and self._subscriptions:
            for subscription in self._subscriptions:
                self._node.destroy_subscription(subscription)
            self._subscriptions = []
            self._own.clear()

    def _heard(self, payload: bytes) -> None:
        if payload in self._own:
            self._own.remove(payload)
        else:
            self._foreign.append(time.monotonic())
            if self._on_foreign is not None:
                self._on_foreign()
