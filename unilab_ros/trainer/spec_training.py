"""A robot spec's robot in the trainer: its link (sources, control timer, reset), its joint
command output, and what each control tick does with the training loop.

Each tick steps the robot's ``RobotSteps`` on the newest data and hands the event to the
loop (``TrainingLoop.on_step``), whose decisions the node carries out. Stale data, a robot
waiting for fresh data after a reset, and a finished episode get the safe action on that
tick; a finished episode then resets the robot (``RobotLink.reset_robot``). A step the
source cut (stale data, or one far longer than a control period in the robot's time) cuts
its segment in the loop on the same tick, before the next step could continue it. Nothing
is ticked while an update runs: the robot holds the safe action the update began with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from rclpy.node import Node
from rclpy.qos import QoSProfile

from unilab_ros.config.paths import robot_spec_file
from unilab_ros.loop.decisions import Decision
from unilab_ros.loop.training_loop import Phase, TrainingLoop
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.spec import load_spec
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.ros.action_output import ActionOutputConfig
from unilab_ros.ros.params import read_config, report_config
from unilab_ros.ros.spec_link import JointCommandOutput, RobotLink
from unilab_ros.trainer.session import SessionConfig, with_robot_spec
from unilab_ros.trainer.spec_parameters import shown_actions, shown_msg_type


def robot_spec_session(name: str, cfg: SessionConfig) -> tuple[SessionConfig, list[str]]:
    """``cfg`` for the robot spec the ``robot_spec`` parameter names (unchanged for none),
    and a note per setting the spec replaced; raises SpecError, FileNotFoundError or
    ValueError with the reason."""
    if not name:
        return cfg, []
    return with_robot_spec(cfg, load_spec(robot_spec_file(name)))


def report_spec_parameters(node: Node, spec: RobotSpec) -> None:
    """Write what ``spec`` decides back into the node's parameters: the sizes, the action
    mapping in command units and the command message type, so ``ros2 param get`` / ``dump``
    show what runs (the params file's values stay only where the spec decides nothing)."""
    agent = read_config(node, AgentConfig)
    report_config(node, replace(agent, obs_dim=ObservationBuilder(spec).dim,
                                action_dim=len(spec.actions.joints), num_envs=1))
    report_config(node, shown_actions(spec))
    msg_type = shown_msg_type(spec)
    if msg_type is not None:
        report_config(node, replace(read_config(node, ActionOutputConfig),
                                    action_msg_type=msg_type))


CLOCK_HINT_S = 1000.0
"""Seconds of age beyond which stale data means the robot and this node keep different
clocks rather than a robot that stopped publishing."""


def stale_line(stale: dict[str, float], sim_time: bool) -> str:
    """The warning for stale sources (name -> age, s); data older than ``CLOCK_HINT_S``
    comes from another clock, and a node not on sim time is told about ``use_sim_time``."""
    ages = ", ".join(f"{name} {age:.3f} s" for name, age in stale.items())
    line = f"stale data ({ages} old): the safe action; a step in progress is cut"
    if max(stale.values()) > CLOCK_HINT_S:
        line += ("; stamps that old come from another clock: " + (
            "this node runs on the wall clock (use_sim_time is false) and the robot's "
            "stamps look like sim time: set use_sim_time:=true" if not sim_time else
            "the robot stamps with another clock than /clock"))
    return line


def robot_status(robots: list[SpecRobot], names: list[str], now: float) -> dict:
    """Each spec robot's link status (``RobotLink.status``), by robot name."""
    return {name or robot.link.spec.name: robot.link.status(now)
            for name, robot in zip(names, robots, strict=True)}


def in_slack(inputs: list, work: Callable[[], None]) -> None:
    """Run ``work`` in the first spec robot's control-loop slack, right after a tick
    (``RobotLink.in_slack``), or now when there is none or it is not ticking."""
    links = [robot.link for robot in inputs if isinstance(robot, SpecRobot)]
    if not (links and links[0].in_slack(work)):
        work()


class SpecRobot:
    """Robot ``r`` of the loop, driven through its spec; ``link`` and ``output`` are its ROS
    ends."""

    def __init__(
        self, node: Node, loop: TrainingLoop, r: int, spec: RobotSpec, prefix: str,
        qos: QoSProfile, carry_out: Callable[[list[Decision]], None],
        publish_safe: Callable[[int], None], service_timeout: float, spin_margin: float,
    ) -> None:
        steps = loop.robots[r].source
        if not isinstance(steps, RobotSteps):
            raise TypeError("a spec robot's step source is a RobotSteps")
        self._node, self._loop, self._r = node, loop, r
        self._carry_out, self._publish_safe = carry_out, publish_safe
        self.steps = steps
        self.output = JointCommandOutput(node, spec, qos, prefix + spec.actions.topic)
        self.link = RobotLink(node, spec, steps, prefix, qos, self._tick, service_timeout,
                              spin_margin)
        report_spec_parameters(node, spec)

    @property
    def subscriptions(self) -> list:
        return self.link.subscriptions

    @property
    def holding(self) -> bool:
        """The robot is to get the safe action, not the policy's (its episode is over)."""
        return self.steps.needs_reset

    def drain(self) -> None:
        self.link.drain()

    def _tick(self, now: float) -> None:
        loop, steps = self._loop, self.steps
        if loop.phase in (Phase.UPDATING, Phase.FINISHED):
            self.link.jitter.restart()
            return
        event = None if self.link.joint_error else steps.tick(now)
        if steps.cut_pending:
            self._carry_out(loop.check_step_deadlines(now))
        self._carry_out(loop.on_step(self._r, event, now, time.monotonic()))
        if steps.stale:
            self.link.warn("stale", stale_line(steps.stale,
                                               self._node.get_clock().ros_time_is_active))
        if self.link.joint_error:
            self.link.warn("joints", f"waiting for the robot's joints to match the spec: "
                           f"{self.link.joint_error}", level="error")
        if steps.needs_reset or (event is None and steps.newest):
            self._publish_safe(self._r)
        if steps.needs_reset:
            self.link.reset_robot()
