"""How the trainer takes a robot's topic-contract messages in: subscribed with reception
stamps, validated (bad input counted and logged, throttled per topic), handed to the
loop, and drained when they queued up during an update."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.subscription import Subscription
from std_msgs.msg import Float32MultiArray, UInt8MultiArray

from unilab_ros.loop.decisions import Decision
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.ros.messages import MessageError, read_done_codes, read_matrix, read_vector
from unilab_ros.ros.qos import overridable

WARN_PERIOD = 5.0
"""Seconds between repeats of one topic's bad-input warning."""


def stamped_at_reception(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the middleware's reception time (ns)."""

    def callback(msg: Any, info: dict[str, Any]) -> None:
        handler(msg, info["received_timestamp"])

    return node.create_subscription(msg_type, topic, callback, qos,
                                    qos_overriding_options=overridable())


def stamped_at_entry(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the time its callback started (ns).

    rclpy 9's EventsExecutor cannot pass message info; it needs no reception stamp
    either, since it runs callbacks in arrival order.
    """

    def callback(msg: Any) -> None:
        handler(msg, time.time_ns())

    return node.create_subscription(msg_type, topic, callback, qos,
                                    qos_overriding_options=overridable())


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


class RobotInput:
    """Robot ``r``'s ``observation``, ``reward`` and ``done`` under ``prefix``: each valid
    message goes to the loop, and ``carry_out`` gets the loop's decisions."""

    holding = False
    """The policy's actions go out (a spec robot may hold the safe action instead)."""

    def __init__(
        self, node: Node, loop: TrainingLoop, r: int, prefix: str, arrival_ordered: bool,
        qos: QoSProfile, limits: tuple[float, float],
        carry_out: Callable[[list[Decision]], None],
    ) -> None:
        self._node = node
        self._loop = loop
        self._r = r
        self._observation_limit, self._reward_limit = limits
        self._carry_out = carry_out
        self._warned_at: dict[str, float] = {}
        self._shape = loop.actions.safe.shape[0], loop.agent.cfg.obs_dim
        subscribe = stamped_at_entry if arrival_ordered else stamped_at_reception
        self.subscriptions = (
            subscribe(node, Float32MultiArray, prefix + "observation",
                      functools.partial(self._while_ros_runs, self.observation), qos),
            subscribe(node, Float32MultiArray, prefix + "reward",
                      functools.partial(self._while_ros_runs, self.reward), qos),
            subscribe(node, UInt8MultiArray, prefix + "done",
                      functools.partial(self._while_ros_runs, self.done), qos),
        )

    def _while_ros_runs(self, receive: Callable[[Any, int], bool], msg: Any, stamp: int) -> None:
        # Once ROS is shut down (a signal) the executor may still run queued callbacks, and
        # their publishing would fail with an invalid context.
        if self._node.context.ok():
            receive(msg, stamp)

    def _now(self) -> float:
        return self._node.get_clock().now().nanoseconds * 1e-9

    def observation(self, msg: Float32MultiArray, stamp: int) -> bool:
        """Hand a valid observation to the loop; False when it was rejected."""
        obs = self._read("observation", read_matrix, msg, *self._shape,
                         limit=self._observation_limit)
        if obs is not None:
            self._carry_out(self._loop.on_observation(self._r, obs, stamp, self._now(),
                                                      time.monotonic()))
        return obs is not None

    def reward(self, msg: Float32MultiArray, stamp: int) -> bool:
        reward = self._read("reward", read_vector, msg, self._shape[0],
                            limit=self._reward_limit)
        if reward is not None:
            self._carry_out(self._loop.on_reward(self._r, reward, stamp, self._now()))
        return reward is not None

    def done(self, msg: UInt8MultiArray, stamp: int) -> bool:
        done = self._read("done", read_done_codes, msg, self._shape[0])
        if done is not None:
            self._carry_out(self._loop.on_done(self._r, done, stamp, self._now()))
        return done is not None

    def _read(
        self, kind: str, reader: Any, msg: Any, *shape: int, **limit: float
    ) -> np.ndarray | None:
        try:
            return reader(msg, *shape, **limit)
        except MessageError as error:
            rejected = self._loop.counters.add(f"rejected_{kind}s")
            # Throttled per topic: rclpy throttles per call site, and one noisy topic
            # must not hide the others' problems.
            now = time.monotonic()
            if now - self._warned_at.get(kind, -math.inf) >= WARN_PERIOD:
                self._warned_at[kind] = now
                self._node.get_logger().warning(
                    f"rejected {kind} ({rejected} so far): {error.reason}")
            return None

    def drain(self) -> None:
        """Discard what arrived during the update (see ``drain``): the loop counts a valid
        one as discarded (it is updating) and keeps the newest observation; bad input is
        bad input whenever it comes: counted (and logged) as such, and discarded."""
        for sub, receive in zip(self.subscriptions, (self.observation, self.reward, self.done),
                                strict=True):
            for _ in range(drain(sub, receive)):
                self._loop.counters.add("discarded_during_update")
