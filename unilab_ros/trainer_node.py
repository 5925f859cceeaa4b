"""trainer_node (node ``unilab_trainer``): learns a policy online over the topic contract.

Subscribes ``observation``, ``reward`` and ``done``; publishes ``action``, ``~/status``
and ``/diagnostics``. With ``robots`` given it trains a fleet: those topics under each
robot's namespace, one rollout. What to do with each step is decided by ``TrainingLoop``
(``FleetLoop`` for a fleet; both ROS-free); this node converts messages, keeps the
clocks and timers, and talks to ROS: the simulator's pause, reports, checkpoints,
services and parameters. All MLX work runs on the executor's one thread.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from rclpy.subscription import Subscription
from std_msgs.msg import Bool, Float32MultiArray, String, UInt8MultiArray
from std_srvs.srv import SetBool, Trigger

from unilab_ros.action_output import ActionOutput, ActionOutputConfig
from unilab_ros.action_safety import ActionSafetyConfig
from unilab_ros.executors import run_node
from unilab_ros.fleet_loop import FleetLoop, RobotAction, RobotStalled
from unilab_ros.messages import MessageError, read_done_codes, read_matrix, read_vector
from unilab_ros.metrics_log import MetricsLog
from unilab_ros.params import (
    ConfigError,
    declare_config,
    read_config,
    warn_unknown_parameters,
)
from unilab_ros.rl import PPOAgent, heap
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, warm_up_update
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.blas import blas_description
from unilab_ros.rl.bundle import BundleError, bundle_from_agent, save_bundle
from unilab_ros.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    remove_stale_temporaries,
    restore_agent,
    save_checkpoint,
)
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.finetune import FineTuneConfig, make_agent
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.run_folder import new_run_folder
from unilab_ros.sim_pause import SimPause
from unilab_ros.trainer_config import TrainerNodeConfig
from unilab_ros.training_loop import (
    BeginUpdate,
    Decision,
    Finished,
    LoopConfig,
    Phase,
    PublishAction,
    TrainingLoop,
)
from unilab_ros.watchdog import Watchdog, WatchdogConfig

NODE_NAME = "unilab_trainer"
LIVE_PARAMETERS = frozenset({"training", "deterministic", "ppo.learning_rate"})
"""Parameters that take effect while running; every other one is read-only after start."""
_WARN_PERIOD = 5.0
"""Seconds between repeats of one kind of warning."""
_SAVE_SERVICE_MIN_PERIOD = 1.0
"""Seconds between two saves asked for through ~/save_checkpoint."""


def _while_ros_runs(method: Callable[..., None]) -> Callable[..., None]:
    """Skip a callback once ROS is shut down (a signal): the executor may still run
    queued ones, and their publishing would fail with an invalid context."""

    @functools.wraps(method)
    def guarded(self: Node, *args: Any) -> None:
        if self.context.ok():
            method(self, *args)

    return guarded


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
        for config, prefix in (
            (AgentConfig(), ""),
            (ActionConfig(), ""),
            (LoopConfig(), ""),
            (WatchdogConfig(), ""),
            (ActionOutputConfig(), ""),
            (ActionSafetyConfig(), ""),
            (TrainerNodeConfig(), ""),
            (FineTuneConfig(), "finetune"),
            (ModelConfig(), "model"),
            (PPOConfig(), "ppo"),
            (PPORuntimeConfig(), "ppo"),
        ):
            declare_config(self, config, prefix, LIVE_PARAMETERS)
        warn_unknown_parameters(self)
        self.cfg = read_config(self, TrainerNodeConfig)
        loop_cfg = read_config(self, LoopConfig)
        watchdog_cfg = self.watchdog_cfg = read_config(self, WatchdogConfig)
        output_cfg = read_config(self, ActionOutputConfig)
        safety_cfg = read_config(self, ActionSafetyConfig)
        agent_cfg = read_config(self, AgentConfig)
        try:
            model_cfg = read_config(self, ModelConfig, "model")
            ppo_cfg = read_config(self, PPOConfig, "ppo")
            runtime_cfg = read_config(self, PPORuntimeConfig, "ppo")
            fine_tune = read_config(self, FineTuneConfig, "finetune")
            if fine_tune.init_from and self.cfg.resume_from:
                raise ValueError(
                    "resume_from continues a training, finetune.init_from starts one from "
                    "a policy: give one of them"
                )
            self._action_cfg = read_config(self, ActionConfig)
            # A robot's messages have num_envs rows; the agent acts for the whole fleet.
            actions = ActionMapper(self._action_cfg, agent_cfg.num_envs, agent_cfg.action_dim)
            robots = self.cfg.robots
            if robots:
                agent_cfg = replace(agent_cfg, num_envs=agent_cfg.num_envs * len(robots))
            # Opened first: a bad path is reported alone, before any warm-up.
            checkpoint = Checkpoint(self.cfg.resume_from) if self.cfg.resume_from else None
            if self.cfg.warm_up_update:
                # Before the agent: the warm-up reseeds MLX, and the agent seeds it again.
                seconds = warm_up_update(agent_cfg, model_cfg, ppo_cfg, runtime_cfg)
                self.get_logger().info(
                    f"start-up: one throwaway PPO update compiled MLX's kernels in "
                    f"{seconds:.1f} s, before the first action (cached on disk afterwards)"
                )
            agent, notes = make_agent(
                agent_cfg, model_cfg, ppo_cfg, actions.policy_bounds(), self._action_cfg,
                fine_tune, runtime_cfg,
            )
            if checkpoint is not None:
                restore_agent(agent, checkpoint)
        except (ValueError, CheckpointError) as error:
            raise ConfigError(str(error)) from None
        if fine_tune.init_from:
            self.get_logger().info(f"fine-tuning from {fine_tune.init_from}")
        for note in notes:
            self.get_logger().warning(note)
        self.num_envs, self.obs_dim = actions.safe.shape[0], agent_cfg.obs_dim
        stats = EpisodeStats(agent_cfg.num_envs)
        if checkpoint is not None:
            stats.load_state(checkpoint.extra.get("episodes", {}))
        self.best = BestPolicy(self.cfg.best_min_episodes, self._save_best)
        try:
            self.loop: TrainingLoop | FleetLoop = (
                FleetLoop(loop_cfg, agent, actions, robots, stats, self.best, watchdog_cfg,
                          safety_cfg) if robots else
                TrainingLoop(loop_cfg, agent, actions, stats, self.best, watchdog_cfg,
                             safety_cfg)
            )
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self._last_service_save = -math.inf
        self.last_save_error = ""
        self._save_errors_logged: set[tuple[str, int | None]] = set()
        self._warned_at: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self._iteration_start = (time.perf_counter(), agent.env_steps)
        self._checkpoint_dir = self._output_folder()
        try:
            stale = remove_stale_temporaries(self._checkpoint_dir)
        except OSError:
            stale = []
        if stale:
            self.get_logger().info(
                f"removed {len(stale)} temporary file(s) of saves that never finished"
            )
        self._log = MetricsLog(self._checkpoint_dir, self.cfg.tensorboard)

        qos = QoSProfile(depth=self.cfg.qos_depth)
        self._status_pub = self.create_publisher(String, "~/status", qos)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", qos)
        subscribe = _stamped_at_entry if arrival_ordered else _stamped_at_reception
        self._robots = [
            self._connect(r, f"{name.strip('/')}/", subscribe, output_cfg, qos)
            for r, name in enumerate(robots or [""])
        ]
        self._paused_robots: list[int] = []
        """The robots whose simulators were paused for the update in progress."""
        self.create_subscription(Bool, "estop", self._on_estop, qos)
        if self.cfg.control_services:
            self.create_service(Trigger, "~/save_checkpoint", self._srv_save)
            self.create_service(Trigger, "~/export_bundle", self._srv_export_bundle)
            self.create_service(SetBool, "~/set_training", self._srv_set_training)
            self.create_service(SetBool, "~/set_deterministic", self._srv_set_deterministic)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        # Step deadlines follow the node clock (a paused simulator drops nothing); the
        # watchdog follows the steady clock (it must fire even when sim time stops).
        self.create_timer(min(0.05, loop_cfg.step_timeout / 4.0), self._check_step_deadline)
        self.create_timer(Watchdog(watchdog_cfg).period, self._watchdog, clock=steady)
        self.create_timer(1.0, self._publish_status, clock=steady)
        self.create_timer(self.cfg.wait_report_period, self._report_waiting, clock=steady)
        self.get_logger().info(
            f"ready: {self._fleet_size()}{self.num_envs} envs x obs {self.obs_dim} -> action "
            f"{agent_cfg.action_dim}, rollout {agent_cfg.num_steps} steps, iteration "
            f"{agent.iteration}, BLAS: {blas_description()}, heap: {heap.status}; "
            f"output: {self._checkpoint_dir}"
        )
        self._closed = False

    def _connect(
        self, r: int, prefix: str, subscribe: Any, output_cfg: ActionOutputConfig,
        qos: QoSProfile,
    ) -> _Robot:
        """Topics and simulator services of robot ``r``, under ``prefix`` ("/": none)."""
        prefix = prefix.lstrip("/")

        def scoped(service: str) -> str:
            # A relative service name is the robot's (its simulator's pause).
            return service if not service or service.startswith("/") else prefix + service

        return _Robot(
            prefix.rstrip("/"),
            subscribe(self, Float32MultiArray, prefix + "observation",
                      functools.partial(self._on_observation, r), qos),
            subscribe(self, Float32MultiArray, prefix + "reward",
                      functools.partial(self._on_reward, r), qos),
            subscribe(self, UInt8MultiArray, prefix + "done",
                      functools.partial(self._on_done, r), qos),
            ActionOutput(self, output_cfg, qos, prefix + "action"),
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

    def _output_folder(self) -> Path:
        """``checkpoint_dir``, or else a new folder for this run (see run_folder)."""
        if self.cfg.checkpoint_dir:
            return Path(self.cfg.checkpoint_dir)
        try:
            return new_run_folder(Path(self.cfg.runs_root), self.get_namespace())
        except OSError as error:
            raise ConfigError(f"cannot create a run folder under {self.cfg.runs_root}: "
                              f"{error}") from None

    @property
    def finished(self) -> bool:
        return self.loop.phase is Phase.FINISHED

    @property
    def agent(self) -> PPOAgent:
        return self.loop.agent

    @property
    def stats(self) -> EpisodeStats:
        return self.loop.stats

    @property
    def counters(self) -> dict[str, int]:
        return self.loop.counters

    # Message callbacks: convert, validate, hand over to the loop, carry out its decision.

    def _read(
        self, kind: str, reader: Any, msg: Any, *shape: int, **limit: float
    ) -> np.ndarray | None:
        try:
            return reader(msg, *shape, **limit)
        except MessageError as error:
            rejected = self.loop.count(f"rejected_{kind}s")
            # Throttled per topic: rclpy throttles per call site, and one noisy topic
            # must not hide the others' problems.
            now = time.monotonic()
            if now - self._warned_at.get(kind, -math.inf) >= _WARN_PERIOD:
                self._warned_at[kind] = now
                self.get_logger().warning(f"rejected {kind} ({rejected} so far): {error.reason}")
            return None

    @_while_ros_runs
    def _on_observation(self, r: int, msg: Float32MultiArray, stamp: int) -> None:
        self._receive_observation(r, msg, stamp)

    @_while_ros_runs
    def _on_reward(self, r: int, msg: Float32MultiArray, stamp: int) -> None:
        self._receive_reward(r, msg, stamp)

    @_while_ros_runs
    def _on_done(self, r: int, msg: UInt8MultiArray, stamp: int) -> None:
        self._receive_done(r, msg, stamp)

    def _receive_observation(self, r: int, msg: Float32MultiArray, stamp: int) -> bool:
        """Hand a valid observation of robot ``r`` to the loop; False when it was rejected."""
        obs = self._read(
            "observation", read_matrix, msg, self.num_envs, self.obs_dim,
            limit=self.cfg.observation_limit,
        )
        if obs is not None:
            now, steady = self._now(), time.monotonic()
            self._carry_out(
                self.loop.on_observation(r, obs, stamp, now, steady)
                if isinstance(self.loop, FleetLoop)
                else self.loop.on_observation(obs, stamp, now, steady)
            )
        return obs is not None

    def _receive_reward(self, r: int, msg: Float32MultiArray, stamp: int) -> bool:
        reward = self._read(
            "reward", read_vector, msg, self.num_envs, limit=self.cfg.reward_limit
        )
        if reward is not None:
            self._carry_out(
                self.loop.on_reward(r, reward, stamp, self._now())
                if isinstance(self.loop, FleetLoop)
                else self.loop.on_reward(reward, stamp, self._now())
            )
        return reward is not None

    def _receive_done(self, r: int, msg: UInt8MultiArray, stamp: int) -> bool:
        done = self._read("done", read_done_codes, msg, self.num_envs)
        if done is not None:
            self._carry_out(
                self.loop.on_done(r, done, stamp, self._now())
                if isinstance(self.loop, FleetLoop)
                else self.loop.on_done(done, stamp, self._now())
            )
        return done is not None

    @_while_ros_runs
    def _on_estop(self, msg: Bool) -> None:
        engaged = bool(msg.data)
        if engaged != self.loop.estop:
            self.get_logger().warning(
                "e-stop engaged: the safe action, no learning until released" if engaged
                else "e-stop released: the policy blends in again"
            )
        self._carry_out(self.loop.set_estop(engaged))

    def _carry_out(
        self, decision: Decision | RobotAction | RobotStalled | list[Any]
    ) -> None:
        if isinstance(decision, list):
            for each in decision:
                self._carry_out(each)
        elif isinstance(decision, RobotStalled):
            why = (
                f"its simulator did not answer a pause within service_timeout="
                f"{self.cfg.service_timeout}s" if decision.pause_unanswered
                else f"no step within step_timeout={self.loop.cfg.step_timeout}s"
            )
            self.get_logger().warning(
                f"robot {self._robots[decision.robot].name} stalled: {why}, its episodes "
                f"cut; the others go on ({self.loop.counters['robot_stalls']} stalls so far)"
            )
            if decision.then is not None:
                self._publish_action(decision.then, decision.robot)
        elif isinstance(decision, RobotAction):
            if decision.rejoined:
                self.get_logger().info(f"robot {self._robots[decision.robot].name} rejoined")
            self._publish_action(decision.action, decision.robot)
        elif isinstance(decision, PublishAction):
            self._publish_action(decision)
        elif isinstance(decision, BeginUpdate):
            self._begin_update()

    def _publish_action(self, decision: PublishAction, r: int = 0) -> None:
        if decision.nonfinite:
            self.get_logger().error(
                f"the policy gave a non-finite action ({self.counters['nonfinite_actions']} "
                "so far): the safe action was sent instead"
                + ("; the last finite model parameters are restored" if decision.restored
                   else ""),
                throttle_duration_sec=_WARN_PERIOD,
            )
        self._robots[r].action_out.publish(decision.command)

    def _publish_safe_action(self, r: int) -> None:
        self._robots[r].action_out.publish(self.loop.actions.safe)
        self.loop.count("safe_actions_published")

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    @_while_ros_runs
    def _check_step_deadline(self) -> None:
        if isinstance(self.loop, FleetLoop):
            for stalled in self.loop.check_step_deadlines(self._now()):
                self._carry_out(stalled)
            return
        dropped = self.loop.check_step_deadline(self._now())
        if dropped is None:
            return
        self.get_logger().warning(
            f"step not completed within step_timeout={self.loop.cfg.step_timeout}s: dropped "
            f"({self.loop.step_counters['steps_dropped']} so far); the next observation "
            "starts a new segment",
            throttle_duration_sec=_WARN_PERIOD,
        )
        if dropped.then is not None:
            self._publish_action(dropped.then)

    @_while_ros_runs
    def _watchdog(self) -> None:
        steady = time.monotonic()
        if isinstance(self.loop, FleetLoop):
            silences = [(s.robot, s.silence) for s in self.loop.check_watchdogs(steady)]
        else:
            silence = self.loop.check_watchdog(steady)
            silences = [] if silence is None else [(0, silence)]
        for r, silence in silences:
            if silence.first:
                robot = f"robot {self._robots[r].name}: " if self.cfg.robots else ""
                self.get_logger().warning(
                    f"{robot}no observation for {self.watchdog_cfg.obs_timeout}s: "
                    + ("publishing the safe action" if silence.publish_safe else "waiting")
                )
            if silence.publish_safe:
                self._publish_safe_action(r)

    @_while_ros_runs
    def _report_waiting(self) -> None:
        """Before the first observation, say which topics the trainer waits on (resolved,
        so a wrong namespace or remap shows) and how many publishers each has."""
        if self.loop.phase is not Phase.WAITING:
            return
        topics = ", ".join(
            f"{sub.topic_name} ({self.count_publishers(sub.topic_name)} publishers)"
            for robot in self._robots
            for sub in (robot.obs_sub, robot.reward_sub, robot.done_sub)
        )
        outputs = ", ".join(robot.action_out.topic_name for robot in self._robots)
        self.get_logger().info(
            f"waiting for the first observation; subscribed to {topics}; actions go to "
            f"{outputs}"
        )

    # Updating.

    def _begin_update(self) -> None:
        self._publish_status()
        # Pause first: a safe action published before the pause answered could reach the
        # simulator first and step it, a step nobody learns from. The same simulators are
        # resumed after the update.
        self._paused_robots = self.loop.simulators_to_pause()
        self._call_sims(self._paused_robots, "pause", then=self._run_update)

    def _call_sims(self, robots: list[int], call: str, then: Callable[[], None]) -> None:
        """Pause (resume) the simulators of ``robots``, one after the other, then ``then``.
        A pause that goes unanswered goes to the loop (a fleet stalls that robot; it is
        still resumed, in case the pause arrived late)."""
        if not robots:
            then()
            return
        r, sim = robots[0], self._robots[robots[0]].sim

        def next_robot() -> None:
            if call == "pause" and sim.unanswered:
                stalled = self.loop.pause_unanswered(r)
                if stalled is not None:
                    self._carry_out(stalled)
            self._call_sims(robots[1:], call, then)

        getattr(sim, call)(then=next_robot)

    def _run_update(self) -> None:
        if self.cfg.update_safe_action:
            for r in range(len(self._robots)):
                self._publish_safe_action(r)
        first_compile = self.agent.runtime_cfg.enable_compile and not self.cfg.warm_up_update
        if self.loop.updates_run == 0 and first_compile:
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
        due = self.loop.after_update()
        if due is not None:
            self.save(due.reason)
        # Act only once the simulator runs again: an action that reached it still paused
        # would be dropped, and collection would stall until the step timed out.
        self._call_sims(self._paused_robots, "resume", then=self._restart_collecting)

    def _restart_collecting(self) -> None:
        self._drain_queued()
        decision = self.loop.resume(self._now(), time.monotonic())
        if isinstance(decision, Finished):
            self.save("max_iterations reached")
            self.get_logger().info(f"finished {self.agent.iteration} iterations")
        else:
            self._carry_out(decision)

    def _drain_queued(self) -> None:
        """Discard what arrived during the update; the loop keeps the newest observation.

        The executor could only deliver these after the update, mixed with the
        responses to the action that restarts collection; taking them here keeps
        them out of the buffer.
        """
        for r, robot in enumerate(self._robots):
            for sub, receive in (
                (robot.obs_sub, self._receive_observation),
                (robot.reward_sub, self._receive_reward),
                (robot.done_sub, self._receive_done),
            ):
                self._drain(r, sub, receive)

    def _drain(self, r: int, sub: Subscription[Any], receive: Any) -> None:
        while (taken := _take(sub)) is not None:
            msg, info = taken
            # The loop counts a valid one as discarded (it is updating); bad input is
            # bad input whenever it comes: counted (and logged) as such, and discarded.
            if not receive(r, msg, info["received_timestamp"]):
                self.loop.count("discarded_during_update")

    def _report_iteration(self, metrics: dict[str, float]) -> None:
        start, steps = self._iteration_start
        now = time.perf_counter()
        rate = (self.agent.env_steps - steps) / max(now - start, 1e-9)
        self._iteration_start = (now, self.agent.env_steps)
        values = {
            "env_steps": float(self.agent.env_steps),
            "mean_return": self.stats.mean_return,
            "mean_length": self.stats.mean_length,
            "episodes": float(self.stats.episodes),
            "steps_per_s": rate,
            **metrics,
            **{k: float(v) for k, v in self.loop.step_counters.items()},
            **{k: float(v) for k, v in self.counters.items()},
        }
        self.last_metrics = values
        self._log.write(self.agent.iteration, values)
        self._publish_diagnostics(values)
        self.get_logger().info(
            f"iter {self.agent.iteration:5d} | steps {self.agent.env_steps:8d} | "
            f"return {self.stats.mean_return:9.2f} | len {self.stats.mean_length:6.1f} | "
            f"{rate:7.0f} steps/s | update {metrics['update_time']:5.2f}s | "
            f"kl {metrics['approx_kl']:.4f} (max {metrics['approx_kl_max']:.3f}) "
            f"lr {metrics['learning_rate_min']:.0e}..{metrics['learning_rate_max']:.0e} | "
            f"dropped {self.loop.step_counters['steps_dropped']} "
            f"rejected {sum(v for k, v in self.counters.items() if k.startswith('rejected'))}"
        )

    def _publish_diagnostics(self, values: dict[str, float]) -> None:
        dropped = self.loop.step_counters["steps_dropped"]
        problems = dropped + self.counters["rejected_observations"]
        level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        if self.counters["save_failures"] or self._log.failures:
            level = DiagnosticStatus.ERROR
        status = DiagnosticStatus(
            level=level,
            name=f"{self.get_fully_qualified_name()}: training",
            message=f"iteration {self.agent.iteration}",
            hardware_id=self.get_fully_qualified_name(),
            values=[KeyValue(key=k, value=f"{v:.6g}") for k, v in values.items()],
        )
        diagnostics = DiagnosticArray(status=[status])
        diagnostics.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(diagnostics)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.loop.phase.value,
            "iteration": self.agent.iteration,
            "env_steps": self.agent.env_steps,
            "buffer_steps": self.agent.buffer.step,
            "training": self.loop.cfg.training,
            "deterministic": self.loop.cfg.deterministic,
            # JSON has no NaN (strict parsers refuse it): no episode yet reads null.
            "mean_return": _json_number(self.stats.mean_return),
            "sim_service_failures": sum(robot.sim.calls_failed for robot in self._robots),
            "metrics_log_failures": self._log.failures,
            "last_save_error": self.last_save_error,
            **self.loop.step_counters,
            **self.counters,
            **({"stalled_robots": self.loop.stalled_robots}
               if isinstance(self.loop, FleetLoop) else {}),
        }

    @_while_ros_runs
    def _publish_status(self) -> None:
        self._status_pub.publish(String(data=json.dumps(self.status())))

    # Services and checkpoints.

    def save(self, reason: str) -> Path | None:
        """Write the training checkpoint (and ``latest``); returns the iteration's file,
        or None when the disk refused (logged once per kind, counted, training goes on)."""
        extra = {"reason": reason, "node": self.status(), "episodes": self.stats.state()}
        path = self._checkpoint_dir / f"checkpoint_{self.agent.iteration:06d}.safetensors"
        if not self._write_checkpoint(path, extra, f"checkpoint ({reason})"):
            return None
        self._write_checkpoint(self._checkpoint_dir / "latest.safetensors", extra, "latest")
        self._log_line("info", f"checkpoint saved ({reason}): {path}")
        return path

    def _write_checkpoint(self, path: Path, extra: dict[str, Any], what: str) -> bool:
        try:
            save_checkpoint(path, self.agent, extra, self._action_cfg)
        # MLX reports a full disk as RuntimeError, the filesystem the rest as OSError.
        except (OSError, RuntimeError) as error:
            self.loop.count("save_failures")
            self.last_save_error = f"{what}: {type(error).__name__}: {error}"
            kind = (type(error).__name__, getattr(error, "errno", None))
            if kind not in self._save_errors_logged:
                self._save_errors_logged.add(kind)
                self._log_line(
                    "error",
                    f"could not save the {self.last_save_error}; training goes on (this kind "
                    "of error is logged once; see save_failures in ~/status)"
                )
            return False
        return True

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

    def _save_best(self, agent: PPOAgent) -> None:
        """Keep the new best policy as ``best.safetensors`` (a training checkpoint)."""
        best = self.best
        extra = {"reason": "best", "best_mean_return": best.mean_return,
                 "best_min_episodes": best.min_episodes, "node": self.status()}
        path = self._checkpoint_dir / "best.safetensors"
        if self._write_checkpoint(path, extra, "best policy"):
            self.get_logger().info(
                f"new best: mean return {best.mean_return:.2f} over the last "
                f"{best.min_episodes} episodes at iteration {best.iteration}: {path}"
            )

    def _srv_save(self, _request: Trigger.Request, response: Trigger.Response) -> Any:
        # Each save stalls acting for tens of ms: a flood of calls must not stall the robot.
        since = time.monotonic() - self._last_service_save
        if since < _SAVE_SERVICE_MIN_PERIOD:
            self.loop.count("save_requests_refused")
            response.success = False
            response.message = (
                f"saved {since:.2f} s ago; saving at most once every "
                f"{_SAVE_SERVICE_MIN_PERIOD:g} s"
            )
            return response
        self._last_service_save = time.monotonic()
        path = self.save("service call")
        response.success = path is not None
        response.message = (
            str(path) if path is not None else f"saving failed: {self.last_save_error}"
        )
        return response

    def _srv_export_bundle(self, _request: Trigger.Request, response: Trigger.Response) -> Any:
        """Write the current policy as a bundle next to the checkpoints."""
        name = f"bundle_{self.agent.iteration:06d}.safetensors"
        try:
            bundle = bundle_from_agent(self.agent, self._action_cfg, f"{NODE_NAME} (live)")
            path = save_bundle(self._checkpoint_dir / name, bundle)
        # MLX reports a full disk as RuntimeError, the filesystem the rest as OSError.
        except (BundleError, OSError, RuntimeError) as error:
            response.success = False
            response.message = f"export failed: {type(error).__name__}: {error}"
            return response
        self.get_logger().info(f"policy bundle written: {path}")
        response.success, response.message = True, str(path)
        return response

    def _srv_set_training(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("training", request.data, response)

    def _srv_set_deterministic(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("deterministic", request.data, response)

    def _set_by_service(self, name: str, value: bool, response: SetBool.Response) -> Any:
        """The services set the parameter, so both always agree (one path: the callback)."""
        result = self.set_parameters([Parameter(name, value=bool(value))])[0]
        response.success = result.successful
        response.message = f"{name}={getattr(self.loop.cfg, name)}" + (
            "" if result.successful else f": {result.reason}"
        )
        return response

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Validate every live change first, then apply them all (or none)."""
        live = [param.name for param in params if param.name in LIVE_PARAMETERS]
        if live and not self.cfg.control_services:
            return SetParametersResult(
                successful=False,
                reason=f"{', '.join(live)}: run-time control is off (control_services: false)",
            )
        for param in params:
            if param.name == "ppo.learning_rate":
                rate = float(param.value)
                if not math.isfinite(rate) or rate <= 0.0:
                    return SetParametersResult(
                        successful=False, reason="ppo.learning_rate must be positive"
                    )
        for param in params:
            if param.name == "training":
                self.loop.set_training(bool(param.value))
            elif param.name == "deterministic":
                self.loop.set_deterministic(bool(param.value))
            elif param.name == "ppo.learning_rate":
                self.loop.set_learning_rate(float(param.value))
            else:
                continue
            self.get_logger().info(f"parameter {param.name} set to {param.value}")
        return SetParametersResult(successful=True)

    def close(self) -> None:
        """Save on the way out (shutdown, signal, or the last iteration); once."""
        if self._closed:
            return
        self._closed = True
        if not self.finished and self.agent.iteration > 0:
            self.save("shutdown")
        self._log.close()

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()


@dataclass(frozen=True)
class _Robot:
    """A robot's topics and simulator services (the trainer's own with no fleet)."""

    name: str
    obs_sub: Subscription[Any]
    reward_sub: Subscription[Any]
    done_sub: Subscription[Any]
    action_out: ActionOutput
    sim: SimPause


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _stamped_at_reception(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the middleware's reception time (ns)."""

    def callback(msg: Any, info: dict[str, Any]) -> None:
        handler(msg, info["received_timestamp"])

    return node.create_subscription(msg_type, topic, callback, qos)


def _stamped_at_entry(
    node: Node, msg_type: type, topic: str, handler: Any, qos: QoSProfile
) -> Subscription[Any]:
    """Hand ``handler`` the message and the time its callback started (ns).

    rclpy 9's EventsExecutor cannot pass message info; it needs no reception stamp
    either, since it runs callbacks in arrival order.
    """

    def callback(msg: Any) -> None:
        handler(msg, time.time_ns())

    return node.create_subscription(msg_type, topic, callback, qos)


def _take(sub: Subscription[Any]) -> tuple[Any, dict[str, Any]] | None:
    """Take one queued message with its info, as the executor itself does."""
    with sub.handle:
        return sub.handle.take_message(sub.msg_type, sub.raw)


def main(args: list[str] | None = None) -> None:
    run_node(
        NODE_NAME, lambda ordered: TrainerNode(arrival_ordered=ordered), args, (ConfigError,)
    )


if __name__ == "__main__":
    main()
