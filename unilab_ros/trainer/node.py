"""trainer_node (node ``unilab_trainer``): learns a policy online over the topic contract.

Subscribes ``observation``, ``reward`` and ``done``; publishes ``action``, ``~/status``
and ``/diagnostics``. With ``robots`` given it trains a fleet: those topics under each
robot's namespace, one rollout. This node only wires ROS: it converts messages and hands
them to the ROS-free ``TrainingLoop`` (built by ``session``), carries out the loop's
decisions (publish, pause the simulators and update, save), keeps the clocks and timers
and serves the services and parameters. The run's files are ``artifacts``', the reports
``reports``'. All MLX work runs on the executor's one thread.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_msgs.msg import Bool, String

from unilab_ros.loop.decisions import (
    BeginUpdate,
    Decision,
    Finished,
    IterationDone,
    PublishAction,
    Save,
    Silent,
    StepDropped,
)
from unilab_ros.loop.training_loop import Phase, TrainingLoop
from unilab_ros.loop.watchdog import Watchdog
from unilab_ros.rl import PPOAgent, heap
from unilab_ros.rl.checkpoint import CheckpointError
from unilab_ros.rl.compute import compute_description
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.robot.payload import robot_payload
from unilab_ros.robot.spec import SpecError
from unilab_ros.ros.action_output import ActionOutput, ActionOutputConfig
from unilab_ros.ros.executors import run_node, while_ros_runs
from unilab_ros.ros.graph_checks import CommandOutput, RivalWatch
from unilab_ros.ros.params import ConfigError, warn_unknown_parameters
from unilab_ros.ros.qos import overridable, topic_qos
from unilab_ros.ros.sim_pause import SimPause
from unilab_ros.trainer import reports
from unilab_ros.trainer.artifacts import RunArtifacts, output_folder, restart
from unilab_ros.trainer.messages_in import RobotInput
from unilab_ros.trainer.parameters import LiveParameters, read_parameters
from unilab_ros.trainer.rival_hold import RivalHold
from unilab_ros.trainer.services import TrainerServices
from unilab_ros.trainer.session import build_session
from unilab_ros.trainer.simulators import Simulators
from unilab_ros.trainer.spec_training import SpecRobot, in_slack, robot_spec_session, robot_status

NODE_NAME = "unilab_trainer"
_WARN_PERIOD = 5.0
"""Seconds between repeats of one kind of warning."""
NEWCOMER_WINDOW = 10.0
"""Seconds after start within which a trainer that finds a live rival (another node that
sends commands on its action topics, see ``graph_checks``) is the newcomer: it refuses to
run (exit 2). Later it is the one that was there first: it stops acting until the rival
is gone."""


@dataclass(frozen=True)
class _RobotIO:
    """A robot's messages in, actions out and simulator services."""

    input: RobotInput | SpecRobot
    action_out: CommandOutput
    sim: SimPause


class TrainerNode(Node):
    """Online PPO trainer; see the module docstring and the README's topic contract."""

    def __init__(self, arrival_ordered: bool = False, **kwargs: Any) -> None:
        """``arrival_ordered``: the executor runs callbacks in arrival order, so the
        time a callback starts orders messages; else the middleware's reception
        stamps do (the SingleThreadedExecutor serves topics in its own order)."""
        # Closed until fully built: at shutdown rclpy's context destroys, and so closes, a
        # node whose constructor raised, and such a node has nothing to save.
        self._closed = True
        super().__init__(NODE_NAME, **kwargs)
        self.exit_code = 0
        """Non-zero once the node refused to run on (``finished`` then ends its spin)."""
        self._started = time.monotonic()
        self._first_action = True
        self.cfg, session_cfg, output_cfg = read_parameters(self)
        try:
            session_cfg, spec_notes = robot_spec_session(self.cfg.robot_spec, session_cfg)
            session_cfg, start = restart(self.cfg.checkpoint_dir, session_cfg)
            session = build_session(session_cfg, start.best)
        except (ValueError, CheckpointError, SpecError, FileNotFoundError) as error:
            raise ConfigError(str(error)) from None
        if session.warm_up_seconds is not None:
            self.get_logger().info(
                f"start-up: one throwaway update compiled MLX's kernels in "
                f"{session.warm_up_seconds:.1f} s, before the first action (cached on disk "
                "afterwards)"
            )
        if session_cfg.fine_tune.init_from:
            self.get_logger().info(f"fine-tuning from {session_cfg.fine_tune.init_from}")
        for note in spec_notes + session.notes + start.notes:
            self.get_logger().warning(note)
        self.loop: TrainingLoop = session.loop
        self._hold = RivalHold(self.loop, self.get_logger())
        self.num_envs, self.obs_dim = self.loop.actions.safe.shape[0], session_cfg.agent.obs_dim
        self.watchdog_cfg = session_cfg.watchdog
        self.spec = session_cfg.robot_spec
        self.report = reports.IterationReport(self.loop)
        try:
            folder, run_folder = output_folder(self.cfg.checkpoint_dir, self.cfg.runs_root,
                                               self.get_namespace())
        except OSError as error:
            raise ConfigError(f"cannot create a run folder under {self.cfg.runs_root}: "
                              f"{error}") from None
        self.artifacts = RunArtifacts(
            folder, self.agent, session_cfg.actions, self.loop.counters, self.cfg.tensorboard,
            self._log_line, run_folder, robot_payload(self.spec),
        )
        self._connect_all(arrival_ordered, output_cfg, session_cfg.loop.step_timeout)
        self.get_logger().info(
            f"ready: {self._fleet_size()}{self.num_envs} envs x obs {self.obs_dim} -> action "
            f"{session_cfg.agent.action_dim}, rollout {session_cfg.agent.num_steps} steps, "
            f"iteration {self.agent.iteration}, {compute_description()}, heap: "
            f"{heap.status}; output: {folder}"
        )
        # Their names exist only once the topics do.
        warn_unknown_parameters(self, qos_overrides=True)
        self._closed = False

    def _connect_all(
        self, arrival_ordered: bool, output_cfg: ActionOutputConfig, step_timeout: float
    ) -> None:
        """Publishers, subscriptions, services, parameter callbacks and timers."""
        qos = topic_qos(self.cfg.qos_depth, self.cfg.qos_reliability)
        self._status_pub = self.create_publisher(String, "~/status", qos,
                                                 qos_overriding_options=overridable())
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", qos,
                                               qos_overriding_options=overridable())
        self._robots = [
            self._connect(r, robot.name, arrival_ordered, output_cfg, qos)
            for r, robot in enumerate(self.loop.robots)
        ]
        self._simulators = Simulators(self, [robot.sim for robot in self._robots], self.loop,
                                      self._carry_out)
        self._watch = RivalWatch(self, [robot.action_out for robot in self._robots],
                                 NEWCOMER_WINDOW, self._on_foreign_command)
        self.create_subscription(Bool, "estop", self._on_estop, qos,
                                 qos_overriding_options=overridable())
        if self.cfg.control_services:
            self._trainer_services = TrainerServices(self, self.loop, self.artifacts, self.save,
                                                     f"{NODE_NAME} (live)")
        self._trainer_parameters = LiveParameters(self, self.loop, self.cfg.control_services)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        # Step deadlines follow the node clock (a paused simulator drops nothing); the
        # watchdog follows the steady clock (it must fire even when sim time stops).
        self.create_timer(min(0.05, step_timeout / 4.0), self._check_step_deadlines)
        self.create_timer(Watchdog(self.watchdog_cfg).period, self._watchdog, clock=steady)
        self.create_timer(1.0, lambda: in_slack([robot.input for robot in self._robots],
                                                self._publish_status), clock=steady)
        self.create_timer(self.cfg.wait_report_period, self._report_waiting, clock=steady)

    def _connect(
        self, r: int, name: str, arrival_ordered: bool, output_cfg: ActionOutputConfig,
        qos: QoSProfile,
    ) -> _RobotIO:
        """Topics and simulator services of robot ``r``, under namespace ``name``."""
        prefix = f"{name.strip('/')}/".lstrip("/")

        def scoped(service: str) -> str:
            # A relative service name is the robot's (its simulator's pause).
            return service if not service or service.startswith("/") else prefix + service

        limits = (self.cfg.observation_limit, self.cfg.reward_limit)
        if self.spec is not None:
            robot = SpecRobot(self, self.loop, r, self.spec, prefix, qos, self._carry_out,
                              self._publish_safe_action, self.cfg.service_timeout,
                              self.cfg.control_spin_margin)
            messages, output = robot, robot.output
        else:
            messages = RobotInput(self, self.loop, r, prefix, arrival_ordered, qos, limits,
                                  self._carry_out)
            output = ActionOutput(self, output_cfg, qos, prefix + "action")
        return _RobotIO(
            messages,
            output,
            SimPause(
                self,
                scoped(self.cfg.pause_service),
                scoped(self.cfg.resume_service),
                self.cfg.pause_service_type,
                self.cfg.service_timeout,
            ),
        )

    def _fleet_size(self) -> str:
        robots = self.cfg.robots
        return f"{len(robots)} robots ({', '.join(robots)}) x " if robots else ""

    @property
    def finished(self) -> bool:
        return self.loop.phase is Phase.FINISHED or self.exit_code != 0

    @property
    def agent(self) -> PPOAgent:
        return self.loop.agent

    @property
    def stats(self) -> EpisodeStats:
        return self.loop.stats

    @property
    def counters(self) -> dict[str, int]:
        return self.loop.counters

    # Decisions.

    @while_ros_runs
    def _on_estop(self, msg: Bool) -> None:
        engaged = bool(msg.data)
        if engaged != self._hold.operator_estop:
            self.get_logger().warning(
                "e-stop engaged: the safe action, no learning until released" if engaged
                else "e-stop released: the policy blends in again"
            )
        self._carry_out(self._hold.set_operator_estop(engaged))

    def _carry_out(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            match decision:
                case PublishAction():
                    self._publish_action(decision)
                case StepDropped():
                    self._on_dropped(decision)
                case Silent():
                    self._on_silence(decision)
                case BeginUpdate():
                    self._begin_update()
                case IterationDone(metrics=metrics):
                    self._report_iteration(metrics)
                case Save(reason="best"):
                    self.artifacts.save_best(self.loop.best, self.status())
                case Save(reason=reason):
                    self.save(reason)
                case Finished():
                    self.save("max_iterations reached")
                    self.get_logger().info(f"finished {self.agent.iteration} iterations")

    def _check_rivals(self) -> None:
        """Refuse to run next to a rival found within ``NEWCOMER_WINDOW`` of the start;
        later, stop acting and learning while one is there (``RivalHold``)."""
        newcomer = time.monotonic() - self._started < NEWCOMER_WINDOW
        self._carry_out(self._hold.check(self._watch.check(), newcomer))
        if self._hold.refused:
            self.exit_code = 2

    def _on_foreign_command(self) -> None:
        """A command of another node: a rival starts now, not at the next status tick."""
        if not self._hold.rivals:
            self._check_rivals()

    def _publish_action(self, decision: PublishAction) -> None:
        if decision.rejoined:
            self.get_logger().info(f"robot {self.loop.robots[decision.robot].name} rejoined")
        if decision.nonfinite:
            self.get_logger().error(
                f"the policy gave a non-finite action ({self.counters['nonfinite_actions']} "
                "so far): the safe action was sent instead"
                + ("; the last finite model parameters are restored" if decision.restored
                   else ""),
                throttle_duration_sec=_WARN_PERIOD,
            )
        if not self._robots[decision.robot].input.holding:
            self._publish(decision.robot, decision.command)

    def _publish_safe_action(self, r: int) -> None:
        if self._publish(r, self.loop.hold(r)):
            self.loop.counters.add("safe_actions_published")

    def _publish(self, r: int, command: np.ndarray) -> bool:
        """Send ``command`` to robot ``r`` unless a rival commands it; whether it went out."""
        if self._first_action:
            # Discovery may have found a rival by now, and nothing went out yet.
            self._first_action = False
            self._check_rivals()
        if self._hold.rivals or self.exit_code:
            return False
        self._watch.publish(r, command)
        return True

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    @while_ros_runs
    def _check_step_deadlines(self) -> None:
        self._carry_out(self.loop.check_step_deadlines(self._now()))

    @while_ros_runs
    def _watchdog(self) -> None:
        self._carry_out(self.loop.check_watchdogs(time.monotonic()))

    def _on_dropped(self, dropped: StepDropped) -> None:
        line = reports.dropped_line(self.loop, dropped, self.cfg.service_timeout)
        # Each stall of a fleet's robot is news; one robot's lost steps repeat.
        if self.loop.fleet:
            self.get_logger().warning(line)
        else:
            self.get_logger().warning(line, throttle_duration_sec=_WARN_PERIOD)

    def _on_silence(self, silence: Silent) -> None:
        if silence.first:
            name = self.loop.robots[silence.robot].name
            robot = f"robot {name}: " if self.loop.fleet else ""
            self.get_logger().warning(
                f"{robot}no observation for {self.watchdog_cfg.obs_timeout}s: "
                + ("publishing the safe action" if silence.publish_safe else "waiting")
            )
        if silence.publish_safe:
            self._publish_safe_action(silence.robot)

    @while_ros_runs
    def _report_waiting(self) -> None:
        """Before the first observation, say which topics the trainer waits on (resolved,
        so a wrong namespace or remap shows) and how many publishers each has."""
        if self.loop.phase is not Phase.WAITING:
            return
        self.get_logger().info(reports.waiting_line(
            self, [sub for robot in self._robots for sub in robot.input.subscriptions],
            [robot.action_out.topic_name for robot in self._robots]))

    # Updating.

    def _begin_update(self) -> None:
        self._publish_status()
        # Pause first: a safe action published before the pause answered could reach the
        # simulator first and step it, a step nobody learns from. The same simulators are
        # resumed after the update.
        self._simulators.pause(then=self._run_update)

    def _run_update(self) -> None:
        if self.cfg.update_safe_action:
            for r in self._simulators.running():
                self._publish_safe_action(r)
        compiles = getattr(getattr(self.agent, "runtime_cfg", None), "enable_compile", True)
        if self.loop.updates_run == 0 and compiles and not self.cfg.warm_up_update:
            self.get_logger().info(
                "first update: MLX compiles its kernels (up to a minute on a new machine; "
                "cached on disk afterwards)"
            )
        metrics = self.loop.update()
        if not self.context.ok():
            # A signal arrived during the update and shut ROS down: publishing or logging
            # to /rosout would fail now. close() saves the updated agent on the way out.
            return
        self._report_iteration(metrics)
        self._carry_out(self.loop.after_update())
        # Act only once the simulator runs again: an action that reached it still paused
        # would be dropped, and collection would stall until the step timed out.
        self._simulators.resume(then=self._restart_collecting)

    def _restart_collecting(self) -> None:
        self._drain_queued()
        self._carry_out(self.loop.resume(self._now(), time.monotonic()))

    def _drain_queued(self) -> None:
        for robot in self._robots:
            robot.input.drain()

    def _report_iteration(self, metrics: dict[str, float]) -> None:
        values = self.report.values(metrics)
        self.artifacts.write_metrics(self.agent.iteration, values)
        problems = self.loop.step_counters["steps_dropped"] + reports.rejected_count(self.loop)
        failing = bool(self.counters["save_failures"] or self.artifacts.metrics.failures)
        self._diag_pub.publish(reports.diagnostics(
            values, self.agent.iteration, self.get_fully_qualified_name(), problems, failing,
            self.get_clock().now().to_msg(),
        ))
        self.get_logger().info(self.report.line(metrics))

    @property
    def last_metrics(self) -> dict[str, float]:
        return self.report.last

    def status(self) -> dict[str, Any]:
        return reports.status(
            self.loop,
            sim_service_failures=self._simulators.calls_failed,
            metrics_log_failures=self.artifacts.metrics.failures,
            last_save_error=self.artifacts.last_save_error, **self._hold.status(),
            **({"robots": robot_status([robot.input for robot in self._robots],
                                       self.cfg.robots or [""], self._now())}
               if self.spec is not None else {}),
        )

    @while_ros_runs
    def _publish_status(self) -> None:
        self._check_rivals()
        self._status_pub.publish(String(data=json.dumps(self.status())))

    # Services and checkpoints.

    def save(self, reason: str) -> Path | None:
        """Write the training checkpoint (and ``latest``); returns the iteration's file,
        or None when the disk refused (logged once per kind, counted, training goes on)."""
        return self.artifacts.save(reason, self.status(), self.stats)

    def _log_line(self, level: str, text: str) -> None:
        """Log, also while shutting down: the ROS logger would then fail to publish the
        line to /rosout (the context is gone), so it goes to stderr in the same format."""
        # One call per level: rclpy ties a call site to one severity.
        if self.context.ok() and level == "error":
            self.get_logger().error(text)
        elif self.context.ok():
            self.get_logger().info(text)
        else:
            print(f"[{level.upper()}] [{self.get_name()}]: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop a learner thread, then save what it learned on the way out (shutdown,
        signal, or the last iteration); once."""
        if self._closed:
            return
        self._closed = True
        self.loop.close()
        if not self.finished and self.agent.iteration > 0:
            self.save("shutdown")
        self.artifacts.close()

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    run_node(
        NODE_NAME, lambda ordered: TrainerNode(arrival_ordered=ordered), args, (ConfigError,)
    )


if __name__ == "__main__":
    main()
