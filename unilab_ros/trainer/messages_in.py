"""How the trainer takes messages in: reception stamps, and draining what queued up
during an update."""

from __future__ import annotations

import time
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.subscription import Subscription


def stamped_at_reception(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the middleware's reception time (ns)."""

    def callback(msg: Any, info: dict[str, Any]) -> None:
        handler(msg, info["received_timestamp"])

    return node.create_subscription(msg_type, topic, callback, qos)


def stamped_at_entry(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the time its callback started (ns).

    rclpy 9's EventsExecutor cannot pass message info; it needs no reception stamp
    either, since it runs callbacks in arrival order.
    """

    def callback(msg: Any) -> None:
        handler(msg, time.time_ns())

    return node.create_subscription(msg_type, topic, callback, qos)


def drain(sub: Subscription[Any], receive: Any) -> int:
    """Take every message queued on ``sub`` and hand each to ``receive(msg, stamp)``,
    which returns whether it was valid; the number of invalid ones.

    The executor could only deliver these after an update, mixed with the responses to
    the action that restarts collection; taking them at once keeps them out of it.
    """
    invalid = 0
    while True:
        with sub.handle:
            taken = sub.handle.take_message(sub.msg_type, sub.raw)
        if taken is None:
            return invalid
        msg, info = taken
        if not receive(msg, info["received_timestamp"]):
            invalid += 1
