"""policy_node (node ``unilab_policy``): runs a trained policy, inference only.

A lifecycle node (``ros2 lifecycle set /unilab_policy configure|activate|deactivate``):
configure loads the policy bundle or checkpoint, activate starts commanding, deactivate
sends the safe action and stops, shutdown ends the process. Active, it subscribes
``observation`` and publishes ``action`` (same contract as the trainer); sizes,
architecture, observation normalizer and action mapping come from the bundle. ``estop``
(std_msgs/Bool) holds the safe action while true; a watchdog sends it when observations
stop; ``ActionGuard`` rate-limits, smooths and blends the policy in after activation, an
e-stop or a watchdog trip. Its limits are in command units (what the robot receives); a
robot spec's guard (policy units, x |scale|) also holds, the stricter per joint.

A robot spec's policy activates only on a robot whose joints match the spec
(``DeployedRobot.activation_refusal``): ``start_state: active`` waits for one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from std_msgs.msg import Bool, Float32MultiArray, String
from std_srvs.srv import SetBool

from unilab_ros.deploy.spec_control import DeployedRobot
from unilab_ros.loop.action_safety import ActionGuard, ActionSafetyConfig, describe, stricter
from unilab_ros.loop.counters import Counters
from unilab_ros.loop.watchdog import Watchdog, WatchdogConfig
from unilab_ros.rl.actions import ActionConfig, ActionMapper, override_actions
from unilab_ros.rl.bundle import read_policy
from unilab_ros.rl.model import MLPActorCritic
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.payload import spec_of
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.ros.action_output import ActionOutput, ActionOutputConfig
from unilab_ros.ros.executors import run_node
from unilab_ros.ros.graph_checks import RivalWatch
from unilab_ros.ros.messages import MessageError, read_matrix
from unilab_ros.ros.params import (
    ConfigError,
    declare_config,
    given_parameters,
    read_config,
    report_config,
    warn_unknown_parameters,
)
from unilab_ros.ros.qos import RELIABILITIES, overridable, topic_qos

NODE_NAME = "unilab_policy"
START_STATES = ("unconfigured", "inactive", "active")
ACTIVATE_POLL = 0.1
"""Seconds between checks of a spec robot's joints while ``start_state: active`` waits."""
REFUSAL_LOG_PERIOD = 5.0
"""Seconds between the log lines of an activation that waits for matching joints."""
EXIT_DELAY = 0.2
"""Seconds the process lives on after shutdown: the transition's answer leaves first."""


@dataclass
class PolicyNodeConfig:
    """Deployment settings."""

    checkpoint: str = ""
    """Policy bundle (export_bundle), training checkpoint or policy export to run
    (required; loaded on configure)."""
    num_envs: int = 1
    """Rows of the observation and action messages."""
    deterministic: bool = True
    """Publish the mean action (else sample from the policy)."""
    qos_depth: int = 10
    """History depth of the topics."""
    qos_reliability: str = "reliable"
    """reliable or best_effort for every topic; one topic's QoS can be changed with its
    qos_overrides.<topic>.* parameters."""
    observation_limit: float = 1e6
    """Observations with any |value| above this are rejected as bad input."""
    reset_between_episodes: bool = False
    """A policy with a robot spec: reset the robot after each episode as the spec says (its
    reset service, or ~/ready), as in training; false: a time-out starts the next episode
    at once and a failure holds the safe action until the next activation."""
    service_timeout: float = 2.0
    """Seconds to wait for the spec's reset service before calling it again."""
    control_spin_margin: float = 0.001
    """A robot spec's control loop on the wall clock: each tick waits, spinning, until this
    many seconds after its timer's scheduled time, so a timer the scheduler wakes up to
    this late still ticks on the period (~/status timer_wake says how late it wakes). Costs
    this x control_rate of a core; 0: off. Under use_sim_time the ticks follow /clock."""
    start_state: str = "unconfigured"
    """The lifecycle state the node takes itself to once started: unconfigured (a lifecycle
    manager or an operator drives it), inactive (configured) or active (configured, then
    activated; a robot spec's policy once the robot's joints were heard and match). A
    configure that fails leaves it unconfigured, with the reason logged."""

    def validate(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint must name a policy bundle or checkpoint file")
        if self.num_envs < 1 or self.qos_depth < 1:
            raise ValueError("num_envs and qos_depth must be positive")
        if not self.observation_limit > 0.0:
            raise ValueError("observation_limit must be positive")
        if not 0.0 <= self.control_spin_margin <= 0.01:
            raise ValueError("control_spin_margin must be in 0..0.01 s")
        if self.qos_reliability not in RELIABILITIES:
            raise ValueError(f"qos_reliability must be one of {sorted(RELIABILITIES)}")
        if self.start_state not in START_STATES:
            raise ValueError(f"start_state must be one of {list(START_STATES)}")


class PolicyNode(LifecycleNode):
    """A lifecycle node: configure loads the policy, activate commands, deactivate goes safe."""

    model: MLPActorCritic
    actions: ActionMapper
    guard: ActionGuard

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.state = "unconfigured"
        """The lifecycle state this node last reached (set before anything can fail: the
        context destroys a node whose construction raised, and ``destroy_node`` reads it)."""
        declare_config(self, PolicyNodeConfig(), live={"deterministic"})
        # A deployed robot reacts to a silence faster than a training run.
        declare_config(self, WatchdogConfig(obs_timeout=0.2))
        declare_config(self, ActionOutputConfig())
        declare_config(self, ActionConfig())
        declare_config(self, ActionSafetyConfig())
        warn_unknown_parameters(self)
        self.cfg = read_config(self, PolicyNodeConfig)
        self.safety_cfg = read_config(self, ActionSafetyConfig)
        self.output_cfg = read_config(self, ActionOutputConfig)
        self.watchdog = Watchdog(read_config(self, WatchdogConfig))
        self.counters = Counters(
            ("actions", "rejected_observations", "watchdog_trips", "nonfinite_actions", "estops")
        )
        self.estopped = False
        self.limits_in_force = ""
        """The guard in force, in command units, for the activation's log line."""
        self.waiting_to_activate = ""
        """Why ``start_state: active`` has not activated yet (empty: not waiting)."""
        self._activate_timer, self._finish_at = None, None
        self._rivals: list[str] = []
        """Other nodes that publish this node's actions (see ``graph_checks``)."""
        self._qos = topic_qos(self.cfg.qos_depth, self.cfg.qos_reliability)
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._status_pub = self.create_publisher(String, "~/status", self._qos,
                                                 qos_overriding_options=overridable())
        # Listening from the start: an e-stop pressed before activation holds it safe.
        self.create_subscription(Bool, "estop", self._on_estop, self._qos,
                                 qos_overriding_options=overridable())
        self.create_service(SetBool, "~/set_deterministic", self._srv_set_deterministic)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.create_timer(1.0, self._status_due, clock=self._steady)
        if self.cfg.start_state != "unconfigured":
            # From the spin, not here: the transitions' events then reach their subscribers.
            self._start_timer = self.create_timer(0.0, self._take_start_state,
                                                  clock=self._steady)

    def _take_start_state(self) -> None:
        # The EventsExecutor may have queued more of the zero-period timer's events by now.
        if self._start_timer is None:
            return
        self.destroy_timer(self._start_timer)
        self._start_timer = None
        configured = self.trigger_configure() == TransitionCallbackReturn.SUCCESS
        if not configured or self.cfg.start_state != "active":
            return
        if self.robot is None:
            self.trigger_activate()
        else:
            self._activate_timer = self.create_timer(ACTIVATE_POLL, self._activate_when_matched,
                                                     clock=self._steady)

    def _activate_when_matched(self) -> None:
        """``start_state: active`` with a robot spec: activate once the robot's joints
        match; until then stay inactive (nothing published) and say why, throttled."""
        if self.state != "inactive":  # an operator took over (cleanup, shutdown, activate)
            self._stop_waiting()
            return
        self.waiting_to_activate = reason = self.robot.activation_refusal()
        if reason:
            self.get_logger().warning(f"not activating yet: {reason}",
                                      throttle_duration_sec=REFUSAL_LOG_PERIOD)
            return
        self._stop_waiting()
        self.trigger_activate()

    def _stop_waiting(self) -> None:
        if self._activate_timer is not None:
            self.destroy_timer(self._activate_timer)
            self._activate_timer = None
        self.waiting_to_activate = ""

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            bundle = read_policy(self.cfg.checkpoint)
            self.model = bundle.model()
            self.actions = ActionMapper(
                self._action_settings(bundle.actions), self.cfg.num_envs, self.model.action_dim
            )
            spec = spec_of(bundle.robot, self.model.obs_dim, self.model.action_dim)
            self.guard = ActionGuard(self._safety(spec, bundle.action_labels),
                                     self.actions.safe)
        except ValueError as error:
            self.get_logger().error(f"cannot configure: {error}")
            return TransitionCallbackReturn.FAILURE
        self.sampler = PolicySampler(self.model, bundle.seed)
        self.robot: DeployedRobot | None = None
        if spec is not None:
            self.robot = DeployedRobot(
                self, spec, self._qos, self.sampler, bundle.seed, self.actions, self.guard,
                self.cfg.reset_between_episodes, self.cfg.service_timeout,
                self.cfg.control_spin_margin, lambda: self.state == "active", self._publish)
            self.robot.on_tick = lambda: self.watchdog.observed(time.monotonic())
            self.robot.deterministic = self.cfg.deterministic
            self._action_out = self.robot.output
            self._obs_sub = None
        else:
            self._action_out = ActionOutput(self, self.output_cfg, self._qos)
            self._obs_sub = self.create_subscription(
                Float32MultiArray, "observation", self._on_observation, self._qos,
                qos_overriding_options=overridable(),
            )
        self._watch = RivalWatch(self, [self._action_out], listen_for=0.0)
        self._watchdog_timer = self.create_timer(
            self.watchdog.period, self._watchdog, clock=self._steady
        )
        # Their names exist only once the topics do.
        warn_unknown_parameters(self, qos_overrides=True)
        source = bundle.source
        self.get_logger().info(
            f"configured with {self.cfg.checkpoint} ({source.get('kind', 'bundle')} of "
            f"iteration {source.get('iteration', '?')}): obs {self.model.obs_dim} -> action "
            f"{self.model.action_dim}"
            + (f", robot spec {spec.name!r}: joints {list(spec.actions.joints)} on "
               f"{self._action_out.topic_name} at {spec.control_rate:g} Hz" if spec else "")
        )
        self.state = "inactive"
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        found = self._watch.check()
        if found:
            self.get_logger().error(
                f"not activated: {'; '.join(found)} (two nodes commanding one robot fight "
                "over it)"
            )
            return TransitionCallbackReturn.FAILURE
        refusal = self.robot.activation_refusal() if self.robot is not None else ""
        if refusal:
            self.get_logger().error(f"not activated: {refusal}")
            return TransitionCallbackReturn.FAILURE
        self._stop_waiting()
        self.guard.hold()
        self.watchdog.reset()
        if self.robot is not None:
            self.robot.start()
        self.state = "active"
        self.get_logger().info(f"active: commanding the robot; limits in force (command "
                               f"units): {self.limits_in_force}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        # Published while the publisher is still enabled: the last command is the safe one.
        self._publish(self.guard.hold())
        self.state = "inactive"
        self.get_logger().info("inactive: sent the safe action, commanding stopped")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self.state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_waiting()
        # Finalized is the end: the process exits (``run_node`` reads ``finished``).
        self._finish_at = time.monotonic() + EXIT_DELAY
        if self.state == "active":
            self._publish(self.guard.hold())
            self.get_logger().info("shutting down: sent the safe action")
        if self.state != "unconfigured":
            self._release()
        self.state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    @property
    def finished(self) -> bool:
        """Shut down (``ros2 lifecycle set ... shutdown``): the process may end."""
        return self._finish_at is not None and time.monotonic() >= self._finish_at

    def _release(self) -> None:
        """Drop what configure made: the publisher, subscription, timer and the policy."""
        self._stop_waiting()
        self._watch.close()
        if self.robot is not None:
            self.robot.destroy()
        else:
            self._action_out.destroy()
            self.destroy_subscription(self._obs_sub)
        self.destroy_timer(self._watchdog_timer)
        del self.model, self.actions, self.guard, self.sampler

    def destroy_node(self) -> None:
        # A node stopped while commanding (a signal) leaves the robot at the safe action.
        if self.state != "finalized" and self.context.ok():
            self.trigger_shutdown()
        super().destroy_node()

    def _action_settings(self, trained: ActionConfig | None) -> ActionConfig:
        """The training's action mapping; a parameter given to this node overrides its
        field, and the log shows both values."""
        settings, notes = override_actions(
            trained, read_config(self, ActionConfig), given_parameters(self)
        )
        for note in notes:
            self.get_logger().warning(note)
        report_config(self, settings)
        return settings

    def _safety(self, spec: RobotSpec | None, labels: list[str]) -> ActionSafetyConfig:
        """The guard in force, in the guard's units; ``limits_in_force`` states it in
        command units. This node's guard parameters are in command units; a robot spec's
        guard (policy units, as the training used it) holds too: per joint the stricter."""
        operator = self.safety_cfg
        if spec is None:
            names = labels or [f"action[{i}]" for i in range(self.model.action_dim)]
            self.limits_in_force = describe(operator, names)
            return operator
        joints = JointCommands(spec)
        in_force = stricter(joints.guard_in_command_units(spec.actions.guard), operator,
                            joints.dim)
        self.limits_in_force = (describe(in_force, list(joints.joints)) + " (the stricter of "
                                "the spec's guard and this node's parameters)")
        return joints.guard_in_policy_units(in_force)

    def _publish(self, actions: np.ndarray) -> None:
        """Send ``actions`` (held back while a rival commands); ``actions`` in ~/status
        counts what was sent, the policy's and the safe commands alike."""
        if not self._rivals:
            self._watch.publish(0, actions)
            self.counters.add("actions")

    def _check_rivals(self) -> None:
        """While active, withhold every action while another node commands the robot."""
        found = self._watch.check()
        if found and found != self._rivals:
            self.get_logger().error(
                f"{'; '.join(found)}: commanding stopped until it is gone")
        elif self._rivals and not found:
            self.get_logger().info("the rival is gone: commanding again")
        self._rivals = found

    def _on_estop(self, msg: Bool) -> None:
        engaged = bool(msg.data)
        if engaged == self.estopped:
            return
        self.estopped = engaged
        if getattr(self, "robot", None) is not None:
            self.robot.estopped = engaged
        if engaged:
            self.counters.add("estops")
            self.get_logger().warning("e-stop engaged: holding the safe action")
            if self.state == "active":
                self._publish(self.guard.hold())
        else:
            self.get_logger().warning("e-stop released: blending the policy back in")

    def _on_observation(self, msg: Float32MultiArray) -> None:
        if self.state != "active":
            return
        try:
            obs = read_matrix(
                msg, self.cfg.num_envs, self.model.obs_dim, limit=self.cfg.observation_limit
            )
        except MessageError as error:
            self.counters.add("rejected_observations")
            self.get_logger().warning(
                f"rejected observation: {error.reason}", throttle_duration_sec=5.0
            )
            return
        self.watchdog.observed(time.monotonic())
        if self.estopped:
            self._publish(self.guard.hold())
            return
        command, finite = self.guard.command(self.actions(self.sampler(obs,
                                                                   self.cfg.deterministic)))
        self._publish(command)
        if not finite:
            self.get_logger().error(
                f"the policy gave a non-finite action ({self.counters.add('nonfinite_actions')} "
                "so far): the safe action was sent instead",
                throttle_duration_sec=5.0,
            )

    def _watchdog(self) -> None:
        silence = self.watchdog.check(time.monotonic()) if self.state == "active" else None
        if silence is None:
            return
        if silence.first:
            self.counters.add("watchdog_trips")
            self.get_logger().warning(f"no observation for {self.watchdog.cfg.obs_timeout}s")
        if silence.publish_safe:
            self._publish(self.guard.hold())

    def _srv_set_deterministic(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        # Through the parameter, so the service and `ros2 param get` always agree.
        result = self.set_parameters([Parameter("deterministic", value=bool(request.data))])[0]
        response.success = result.successful
        response.message = f"deterministic={self.cfg.deterministic}"
        return response

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        for param in params:
            if param.name == "deterministic":
                self.cfg.deterministic = bool(param.value)
                if getattr(self, "robot", None) is not None:
                    self.robot.deterministic = self.cfg.deterministic
                self.get_logger().info(f"parameter deterministic set to {param.value}")
        return SetParametersResult(successful=True)

    def _status_due(self) -> None:
        # A robot spec's control loop takes the status into its slack, after a tick.
        robot = getattr(self, "robot", None)
        if robot is None or not robot.link.in_slack(self._publish_status):
            self._publish_status()

    def _publish_status(self) -> None:
        if self.state == "active":
            self._check_rivals()
        status = {"state": self.state, "estop": self.estopped, "watchdog": self.watchdog.tripped,
                  "waiting_to_activate": self.waiting_to_activate}
        if getattr(self, "robot", None) is not None:
            status["robot"] = self.robot.status()
        self._status_pub.publish(String(data=json.dumps({**status, **self.counters})))


def main(args: list[str] | None = None) -> None:
    run_node(NODE_NAME, lambda _ordered: PolicyNode(), args, (ConfigError,))


if __name__ == "__main__":
    main()
