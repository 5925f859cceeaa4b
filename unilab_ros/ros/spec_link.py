"""The ROS side of a robot spec's robot, shared by the trainer and the policy node.

``RobotLink`` subscribes every source of the spec (decoded by ``ros_robot_io``; a broken
message is logged, throttled, counted and dropped), runs the control timer at the spec's
rate on the node clock (sim time under use_sim_time) and hands each tick's time to its
owner, resets the robot after an episode (the spec's reset service, or the operator's
``~/ready``) and measures each source's age and the timer's period jitter for ``~/status``.
Housekeeping handed to ``in_slack`` (the ~1 ms ``~/status``) runs right after a tick, in
the period's slack, so it never delays the next tick: a callback of its own timer would
land on a tick about once a second and be the loop's p99 jitter at 200 Hz.
On the wall clock each tick may wait, spinning, until ``spin_margin`` after its timer's
scheduled time (``ScheduleSpin``): the scheduler wakes a timer a little late, by a varying
amount with a tail past 1 ms on a busy machine, and a tick that waits to a fixed offset
from the schedule takes the timer's lateness out of the period whenever it is under the
margin.
A stamp ahead of the node clock by more than the tolerance is held, not refused, for up to
``CLOCK_BACKLOG_GRACE`` s: under use_sim_time the node clock is the newest /clock message
this executor has run, and after the executor was busy (a PPO update) the sensor message can
run before the /clock messages queued beside it. A stamp still ahead once the grace is over
comes from another clock (refused, counted, logged). Before the first /clock there is no
node clock to compare with: samples are kept without a word.
Each tick also watches the achieved control rate in the robot's time (``RobotSteps.rate``):
a window below the threshold is a throttled warning with the numbers and what to do.
``JointCommandOutput`` publishes the loop's commands (policy units) as the spec's joint
commands. The step logic itself is ``robot.steps.RobotSteps``, ROS-free.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_srvs.srv import Empty, Trigger
from trajectory_msgs.msg import JointTrajectory

from unilab_ros.loop.counters import Counters
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.ros.action_output import CommandPublisher
from unilab_ros.ros.messages import MessageError
from unilab_ros.ros.qos import overridable
from unilab_ros.ros.spec_messages import (
    POINT_FIELDS,
    ahead_reason,
    command_message,
    command_message_type,
    message_type,
    to_sample,
)

WARN_PERIOD = 5.0
"""Seconds between repeats of one kind of warning."""
JITTER_WINDOW = 2000
"""Control periods the jitter percentiles are taken over."""
CLOCK_BACKLOG_GRACE = 1.0
"""Steady seconds a sample stamped ahead of the node clock waits for the node clock (its
/clock messages queued behind it) before it counts as from another clock."""
LINK_COUNTERS = ("joint_mismatches", "reset_calls", "reset_failures", "operator_resets",
                 "held_ahead_of_clock")
"""The link's own counts; a rejected message counts in its ``RobotSteps``' counters
(``rejected_messages``), with every other count of the robot's data, so the progress line
and ``~/status`` read one number."""


class JointCommandOutput(CommandPublisher):
    """Publishes commands in policy units (the loop's, one row) as the spec's joint commands;
    the output interface ``graph_checks.RivalWatch`` publishes through."""

    def __init__(self, node: Node, spec: RobotSpec, qos: QoSProfile, topic: str) -> None:
        self.spec = spec
        self.joints = JointCommands(spec)
        super().__init__(node, command_message_type(spec), topic, qos)

    def wire(self, command: np.ndarray) -> bytes:
        """The joint values ``publish`` sends for ``command``, as bytes (to tell one's own
        commands from a rival's)."""
        return self.joints(command).tobytes()

    def received(self, msg: Any) -> bytes:
        """The joint values of a command message heard on the topic, as bytes."""
        if isinstance(msg, JointTrajectory):
            point = msg.points[0] if msg.points else None
            values = getattr(point, POINT_FIELDS[self.joints.interface]) if point else []
            return np.asarray(values, np.float64).tobytes()
        return np.asarray(msg.data, np.float64).tobytes()

    def publish(self, command: np.ndarray) -> None:
        self._publisher.publish(command_message(self.spec, self.joints(command)))


def _ms_figures(seconds: deque[float]) -> dict[str, float]:
    """p50, p99 and max of ``seconds`` in ms, rounded for ~/status."""
    values = np.fromiter(seconds, float) * 1e3
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": round(float(p50), 4), "p99": round(float(p99), 4),
            "max": round(float(values.max()), 4)}


class PeriodJitter:
    """How far each control period on the node clock lies from the spec's."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._last: float | None = None
        self._errors: deque[float] = deque(maxlen=JITTER_WINDOW)

    def tick(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self._errors.append(abs(now - self._last - self.period))
        # A clock that went back (sim time restarted) starts the measurement over.
        self._last = now

    def restart(self) -> None:
        """Forget the last tick (the timer paused for an update: that gap is no jitter)."""
        self._last = None

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and max of |period - spec period| in ms (None before two ticks)."""
        if not self._errors:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None}
        return {f"{name}_ms": value for name, value in _ms_figures(self._errors).items()}


class ScheduleSpin:
    """Holds a timer's callback, busy-waiting, until ``margin`` s after the timer's scheduled
    time, and records how late the timer woke (its scheduled time is one period before the
    next call rcl has already set, so no anchor of its own can drift). The margin is at
    most half the period: the rest of the period is the tick's."""

    def __init__(self, period: float, margin: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.period = period
        self.margin = min(margin, 0.5 * period)
        self._clock = clock
        self._late: deque[float] = deque(maxlen=JITTER_WINDOW)

    def wait(self, until_next_call: float) -> None:
        """``until_next_call``: seconds from now to the timer's next scheduled call."""
        late = self.period - until_next_call
        if late < 0.0:
            # Not a wake-up of this schedule (the timer was reset or the clock jumped).
            return
        self._late.append(late)
        if late < self.margin:
            # Sleeping would hand the wake-up back to the scheduler, whose lateness this
            # removes; the busy wait costs margin x rate of a core.
            end = self._clock() + self.margin - late
            while self._clock() < end:
                pass

    def summary(self) -> dict[str, float | None]:
        """The margin and how late the timer woke, p50 and p99 in ms (None before a tick):
        a margin above the p99 lateness keeps the period's p99 jitter near zero."""
        if not self._late:
            return {"margin_ms": self.margin * 1e3, "late_p50_ms": None, "late_p99_ms": None}
        figures = _ms_figures(self._late)
        return {"margin_ms": self.margin * 1e3, "late_p50_ms": figures["p50"],
                "late_p99_ms": figures["p99"]}


class RobotLink:
    """One spec robot's sources, control timer and reset, under namespace ``prefix``.

    ``on_tick(now)`` runs at the control rate; ``steps`` (the ``RobotSteps``) has the data.
    """

    def __init__(
        self, node: Node, spec: RobotSpec, steps: RobotSteps, prefix: str, qos: QoSProfile,
        on_tick: Callable[[float], None], service_timeout: float = 2.0,
        spin_margin: float = 0.0,
    ) -> None:
        self.node = node
        self.spec = spec
        self.steps = steps
        self.counters = Counters(LINK_COUNTERS)
        self.jitter = PeriodJitter(spec.dt)
        self.spin = ScheduleSpin(spec.dt, spin_margin)
        self._on_tick = on_tick
        self._service_timeout = service_timeout
        self.joint_error = ""
        """Why the robot's joints do not fit the spec (empty: they do, or none heard)."""
        self._heard: set[str] = set()
        self._warned_at: dict[str, float] = {}
        self._held: dict[str, Any] = {}
        """Per source, the newest sample that waits for the node clock."""
        self._ahead_since: dict[str, float] = {}
        """Per source, since when (steady s) its stamps have been ahead of the node clock."""
        advertised = dict(node.get_topic_names_and_types())
        self.subscriptions = []
        for source in spec.sources:
            topic = node.resolve_topic_name(prefix + source.topic)
            msg_type = message_type(source.type, advertised.get(topic, ()))
            self.subscriptions.append(node.create_subscription(
                msg_type, prefix + source.topic,
                lambda msg, name=source.name, kind=source.type: self._on_message(name, kind,
                                                                                 msg),
                qos, qos_overriding_options=overridable()))
        self._reset_client = None
        self._reset_future: Any = None
        self._reset_sent = 0.0
        self._ready_service = None
        self._announced = False
        if spec.reset.mode == "service":
            service = spec.reset.service
            name = service if service.startswith("/") else prefix + service
            self._reset_client = node.create_client(Empty, name)
        else:
            name = f"~/{prefix}ready"
            self._ready_service = node.create_service(Trigger, name, self._on_ready)
        self._slack_work: Callable[[], None] | None = None
        self._last_tick = -math.inf
        self.timer = node.create_timer(spec.dt, self._tick)

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def _tick(self) -> None:
        if not self.node.context.ok():
            return
        # Sim time advances by /clock messages this thread delivers: nothing to wait for.
        if not self.node.get_clock().ros_time_is_active:
            self.spin.wait(self.timer.time_until_next_call() * 1e-9)
        now = self.now()
        self.jitter.tick(now)
        self._take_held(now)
        self._on_tick(now)
        self._last_tick = time.monotonic()
        shortfall = self.steps.shortfall
        if shortfall is not None:
            self.warn(
                "rate",
                f"control rate {shortfall.achieved_hz:.1f} Hz over the last "
                f"{shortfall.window_s:.1f} s of robot time, below "
                f"{self.steps.rate.threshold:.0%} of the spec's {shortfall.expected_hz:g} Hz "
                f"({self.steps.counters['rate_shortfalls']} such windows): this node cannot "
                "keep up with the robot; lower the robot's real_time_factor (or the spec's "
                f"control_rate). Steps longer than {self.steps.step_deadline:g} s of robot "
                f"time are not learned from ({self.steps.counters['late_steps']} so far)")
        work, self._slack_work = self._slack_work, None
        if work is not None:
            work()

    def in_slack(self, work: Callable[[], None]) -> bool:
        """Run ``work`` right after the next tick when the loop is ticking (a tick within
        two periods, or 50 ms, of steady time); False when it is not (paused sim time, a
        robot being reset by an operator...): the caller runs ``work`` itself. Work queued
        again before the tick replaces the queued one."""
        if time.monotonic() - self._last_tick > max(2.0 * self.spec.dt, 0.05):
            return False
        self._slack_work = work
        return True

    def warn(self, kind: str, text: str, level: str = "warning") -> bool:
        """Log ``text`` unless a line of ``kind`` went out within ``WARN_PERIOD`` (rclpy
        throttles per call site, and one noisy kind must not hide the others); whether it
        went out."""
        now = time.monotonic()
        if now - self._warned_at.get(kind, -math.inf) < WARN_PERIOD:
            return False
        self._warned_at[kind] = now
        getattr(self.node.get_logger(), level)(text)
        return True

    def _on_message(self, name: str, kind: str, msg: Any) -> None:
        now = self.now()
        try:
            sample = to_sample(kind, msg, None)
            if self._held_ahead(name, kind, sample, now):
                return
        except MessageError as error:
            self._reject(name, error.reason)
            return
        self._accept(name, sample, now)

    def _held_ahead(self, name: str, kind: str, sample: Any, now: float) -> bool:
        """Hold ``sample`` while it waits for the node clock (see the module docstring);
        raises MessageError once its source has been ahead longer than the grace."""
        if now <= 0.0 and self.node.get_clock().ros_time_is_active:
            # No /clock yet: nothing to compare with, and no grace runs.
            self._held[name] = sample
            return True
        reason = ahead_reason(sample, now)
        if not reason:
            self._ahead_since.pop(name, None)
            self._held.pop(name, None)
            return False
        since = self._ahead_since.setdefault(name, time.monotonic())
        if time.monotonic() - since > CLOCK_BACKLOG_GRACE:
            self._held.pop(name, None)
            raise MessageError(f"{kind}: {reason}")
        self._held[name] = sample
        self.counters.add("held_ahead_of_clock")
        return True

    def _take_held(self, now: float) -> None:
        """Take the held samples the node clock has caught up with."""
        for name, sample in list(self._held.items()):
            if now > 0.0 and not ahead_reason(sample, now):
                del self._held[name]
                self._ahead_since.pop(name, None)
                self._accept(name, sample, now)

    def _reject(self, name: str, reason: str) -> None:
        rejected = self.steps.counters.add("rejected_messages")
        self.warn(f"rejected {name}",
                  f"source {name!r}: rejected message ({rejected} so far): {reason}")

    def _accept(self, name: str, sample: Any, now: float) -> None:
        try:
            self.steps.on_sample(name, sample, now)
        except ValueError as error:
            self.counters.add("joint_mismatches")
            self.joint_error = f"source {name!r}: {error}"
            self.warn("joints", f"{self.joint_error} (the spec's joints are matched by name; "
                      f"{self.counters['joint_mismatches']} messages so far): the robot gets "
                      "the safe action until its joints match", level="error")
            return
        self.joint_error = ""
        self._heard.add(name)

    @property
    def heard_all(self) -> bool:
        """Every source delivered a valid sample at least once."""
        return len(self._heard) == len(self.spec.sources)

    def reset_robot(self) -> None:
        """Start the robot's next episode after a done (call on every tick until it
        started): the reset service, or the operator's ``~/ready``."""
        if self._reset_client is None:
            if not self._announced:
                self._announced = True
                self.node.get_logger().warning(
                    f"episode over ({', '.join(self.steps.fired) or 'stale data'}): holding "
                    f"the safe action; call {self._ready_service.srv_name} (std_srvs/Trigger) "
                    "when the robot is ready")
            return
        future = self._reset_future
        if future is not None and not future.done():
            if time.monotonic() - self._reset_sent < self._service_timeout:
                return
            future.cancel()
            self.counters.add("reset_failures")
            self.node.get_logger().warning(
                f"reset service {self._reset_client.srv_name} did not answer within "
                f"{self._service_timeout} s: calling it again", throttle_duration_sec=WARN_PERIOD)
        if not self._reset_client.service_is_ready():
            self.node.get_logger().warning(
                f"episode over: waiting for reset service {self._reset_client.srv_name} "
                "(std_srvs/Empty), holding the safe action", throttle_duration_sec=WARN_PERIOD)
            return
        self.counters.add("reset_calls")
        self._reset_sent = time.monotonic()
        self._reset_future = self._reset_client.call_async(Empty.Request())
        self._reset_future.add_done_callback(self._reset_done)

    def _reset_done(self, future: Any) -> None:
        if future is not self._reset_future or future.cancelled():
            return
        self._reset_future = None
        if future.exception() is not None:
            self.counters.add("reset_failures")
            return
        self.steps.start_episode(self.now())

    def _on_ready(self, _request: Trigger.Request, response: Trigger.Response
                  ) -> Trigger.Response:
        if not self.steps.needs_reset:
            response.success, response.message = False, "no episode has ended"
            return response
        self.counters.add("operator_resets")
        self._announced = False
        self.steps.start_episode(self.now())
        response.success = True
        response.message = "episode started: the policy acts on fresh data"
        return response

    def status(self, now: float) -> dict[str, Any]:
        """Source ages (s), stale and awaited sources, jitter and counters, for ~/status."""
        return {
            "ages": {name: None if math.isinf(age) else round(age, 4)
                     for name, age in self.steps.ages(now).items()},
            "stale": sorted(self.steps.stale),
            "waiting_for": list(self.steps.waiting),
            "needs_reset": self.steps.needs_reset,
            "episode_step": self.steps.episode_step,
            "control_rate": self.steps.rate.summary(),
            # How far the robot's data runs ahead of this node's clock (a lagging /clock).
            "clock_lag_s": (round(self.steps.robot_time - now, 4)
                            if math.isfinite(self.steps.robot_time) else None),
            "period_jitter": self.jitter.summary(),
            "timer_wake": self.spin.summary(),
            "joint_error": self.joint_error,
            **self.steps.counters, **self.counters,
        }

    def drain(self) -> None:
        """Nothing queues while an update runs: the newest sample of each source is kept."""

    def destroy(self) -> None:
        for subscription in self.subscriptions:
            self.node.destroy_subscription(subscription)
        self.node.destroy_timer(self.timer)
        if self._reset_client is not None:
            self.node.destroy_client(self._reset_client)
        if self._ready_service is not None:
            self.node.destroy_service(self._ready_service)
