"""The policy node's robot when the policy carries a robot spec: the observation built by
the same code the training built it with, from the robot's standard messages.

Each control tick (``RobotLink``, the spec's rate on the node clock) steps the robot's
``RobotSteps``: on fresh data the policy acts on the spec's observation and the command
goes out as the spec's joint command; stale data, a joint mismatch or an e-stop get the
safe action. The spec's reward is summed per episode (the deployed return, in
``~/status``). After a done: with ``reset_between_episodes`` the robot is reset as the spec
says (its reset service, or the operator's ``~/ready``); else a time-out starts the next
episode at once (a deployed robot keeps running) and a failure holds the safe action
until the node is activated again. Activation starts an episode (after a reset, with
``reset_between_episodes``); ``activation_refusal`` says why the node must not activate:
a robot whose joints do not match the spec, or one not heard yet (it cannot be checked).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.lifecycle import LifecycleNode
from rclpy.qos import QoSProfile

from unilab_ros.loop.action_safety import ActionGuard
from unilab_ros.loop.steps import SegmentStart, Transition
from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.ros.spec_link import WARN_PERIOD, JointCommandOutput, RobotLink

RETURNS_KEPT = 100
"""Finished episodes whose returns ``~/status`` lists."""
MATCH_HOLD = 1.0
"""Seconds after a joint_states message without the spec's joints during which the node
still refuses to activate (two robots on one topic would otherwise pass between them)."""


class DeployedRobot:
    """A spec robot commanded by a trained policy; ``tick`` runs while the node is active."""

    def __init__(
        self, node: LifecycleNode, spec: RobotSpec, qos: QoSProfile, sampler: PolicySampler,
        seed: int, actions: ActionMapper, guard: ActionGuard, reset_between_episodes: bool,
        service_timeout: float, spin_margin: float, active: Callable[[], bool],
        publish: Callable[[np.ndarray], None],
    ) -> None:
        self._node, self._sampler, self._actions, self._guard = node, sampler, actions, guard
        self._reset_between = reset_between_episodes
        self._active, self._publish = active, publish
        self.steps = RobotSteps(spec, np.random.default_rng(seed))
        self.output = JointCommandOutput(node, spec, qos, spec.actions.topic)
        self.link = RobotLink(node, spec, self.steps, "", qos, self._tick, service_timeout,
                              spin_margin)
        self.deterministic = True
        self.estopped = False
        self.on_tick: Callable[[], None] = lambda: None
        """Called on every active tick (the node's watchdog: ticks are its sign of life)."""
        self._return = 0.0
        self.returns: deque[float] = deque(maxlen=RETURNS_KEPT)
        self.final_terms: deque[dict[str, float]] = deque(maxlen=RETURNS_KEPT)
        """Each kept episode's last step: every reward term's value, by index:kind."""
        self._last_terms: dict[str, float] = {}
        self._held = False
        self._ending = False
        self._mismatches = 0
        self._mismatch_at = -math.inf

    def activation_refusal(self) -> str:
        """Why the policy must not start commanding this robot (empty: every joint_states
        source was heard with the spec's joints, and no mismatch for ``MATCH_HOLD`` s)."""
        link = self.link
        mismatches = link.counters["joint_mismatches"]
        if mismatches != self._mismatches:
            self._mismatches, self._mismatch_at = mismatches, time.monotonic()
        if link.joint_error:
            return link.joint_error
        if time.monotonic() - self._mismatch_at < MATCH_HOLD:
            return (f"a joint_states message without the spec's joints came within "
                    f"{MATCH_HOLD:g} s")
        unheard = [s.topic for s in self.steps.spec.sources
                   if s.type == "joint_state" and s.name not in self.steps.newest]
        if unheard:
            return f"nothing heard on {unheard} yet: the robot's joints cannot be checked"
        return ""

    def start(self) -> None:
        """Activated: a new episode on the data that arrive from now on; with
        ``reset_between_episodes`` the robot is reset first (a robot left without commands
        before activation may have fallen)."""
        self._held = False
        self._return = 0.0
        self.steps.start_episode(self.link.now())
        if self._reset_between:
            self.steps.needs_reset = True
            self._ending = True

    def _tick(self, now: float) -> None:
        if not self._active():
            return
        self.on_tick()
        steps = self.steps
        if self.link.joint_error or self._held or self.estopped:
            self._publish(self._guard.hold())
            return
        event = steps.tick(now)
        if isinstance(event, Transition):
            self._return += float(event.reward[0])
            self._last_terms = self.steps.term_values()
        if not steps.needs_reset:
            self._ending = False
        if steps.needs_reset:
            failed = isinstance(event, Transition) and event.done[0] == DoneCode.TERMINATED
            self._episode_over(now, failed)
        elif isinstance(event, SegmentStart):
            self._act(event.obs, event.stamp, now)
        elif isinstance(event, Transition):
            self._act(event.next_obs, event.next_obs_stamp, now)
        elif steps.newest:
            self._publish(self._guard.hold())
            if steps.stale:
                ages = ", ".join(f"{name} {age:.3f} s" for name, age in steps.stale.items())
                self._node.get_logger().warning(f"stale data ({ages} old): the safe action",
                                                throttle_duration_sec=WARN_PERIOD)

    def _act(self, obs: np.ndarray, stamp: int, now: float) -> None:
        action = self._sampler(obs, self.deterministic)
        mapped = self._actions(action)
        command, finite = self._guard.command(mapped)
        self._publish(command)
        # What the training's last-action term saw: the policy's own action where the guard
        # left it, what was sent where it changed it (scale 1: commands are policy units).
        sent = np.where(command != mapped, command, action) if finite else command
        self.steps.action_sent(obs, sent, stamp, now)

    def _episode_over(self, now: float, failed: bool) -> None:
        """Every tick from a done until the next episode starts: the safe action; on the
        first, the episode's return is kept and the next episode is arranged."""
        self._publish(self._guard.hold())
        if self._reset_between:
            if not self._ending:
                self._keep_return()
            self.link.reset_robot()
            return
        self._keep_return()
        if failed:
            self._held = True
            self._node.get_logger().error(
                f"failure termination ({', '.join(self.steps.fired)}): holding the safe "
                "action until the node is activated again")
        else:
            self.steps.start_episode(now)

    def _keep_return(self) -> None:
        self._ending = True
        self.returns.append(self._return)
        self.final_terms.append(self._last_terms)
        self._return = 0.0

    def status(self) -> dict[str, Any]:
        returns = list(self.returns)
        return {**self.link.status(self.link.now()), "episodes": len(returns),
                "episode_returns": [round(r, 4) for r in returns],
                "episode_final_terms": list(self.final_terms),
                "mean_return": round(float(np.mean(returns)), 4) if returns else None,
                "held_after_failure": self._held}

    def destroy(self) -> None:
        self.link.destroy()
        self.output.destroy()
