"""trainer_node (node ``unilab_trainer``): learns a policy online over the topic contract.

Subscribes ``observation``, ``reward`` and ``done``; publishes ``action``, ``~/status``
and ``/diagnostics``. Steps are paired by ``StepSync``, stored and learned from by
``PPOAgent``; this node only converts messages, keeps time and talks to ROS. All MLX
work runs on the executor's one thread.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Callable
from enum import Enum
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
from std_msgs.msg import Float32MultiArray, Float64MultiArray, String, UInt8MultiArray
from std_srvs.srv import SetBool, Trigger

from unilab_ros.executors import run_node
from unilab_ros.messages import (
    MessageError,
    read_done_codes,
    read_matrix,
    read_vector,
    to_float32_msg,
    to_float64_msg,
)
from unilab_ros.metrics_log import MetricsLog
from unilab_ros.params import (
    ConfigError,
    declare_config,
    read_config,
    warn_unknown_parameters,
)
from unilab_ros.rl import PPOAgent
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, warm_up_update
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.blas import blas_description
from unilab_ros.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    all_finite,
    remove_stale_temporaries,
    restore_agent,
    save_checkpoint,
)
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo import PPOConfig
from unilab_ros.sim_pause import SimPause
from unilab_ros.stepper import StepSync, Transition
from unilab_ros.trainer_config import TrainerNodeConfig

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


class State(str, Enum):
    WAITING = "waiting_for_observation"
    COLLECTING = "collecting"
    EPISODE_END = "waiting_for_episode_end"
    UPDATING = "updating"
    FINISHED = "finished"


class TrainerNode(Node):
    """Online PPO trainer; see the module docstring and DESIGN.md's topic contract."""

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
            (TrainerNodeConfig(), ""),
            (ModelConfig(), "model"),
            (PPOConfig(), "ppo"),
        ):
            declare_config(self, config, prefix, LIVE_PARAMETERS)
        warn_unknown_parameters(self)
        self.cfg = read_config(self, TrainerNodeConfig)
        agent_cfg = read_config(self, AgentConfig)
        try:
            model_cfg = read_config(self, ModelConfig, "model")
            ppo_cfg = read_config(self, PPOConfig, "ppo")
            self._action_cfg = read_config(self, ActionConfig)
            self.actions = ActionMapper(
                self._action_cfg, agent_cfg.num_envs, agent_cfg.action_dim
            )
            # Opened first: a bad path is reported alone, before any warm-up.
            checkpoint = Checkpoint(self.cfg.resume_from) if self.cfg.resume_from else None
            if self.cfg.warm_up_update:
                # Before the agent: the warm-up reseeds MLX, and the agent seeds it again.
                seconds = warm_up_update(agent_cfg, model_cfg, ppo_cfg)
                self.get_logger().info(
                    f"start-up: one throwaway PPO update compiled MLX's kernels in "
                    f"{seconds:.1f} s, before the first action (cached on disk afterwards)"
                )
            self.agent = PPOAgent(
                agent_cfg, model_cfg, ppo_cfg, action_bounds=self.actions.policy_bounds()
            )
            self.best = BestPolicy(self.cfg.best_min_episodes, self._save_best)
            if checkpoint is not None:
                restore_agent(self.agent, checkpoint)
            self._good_parameters = self.agent.model.parameters()
        except (ValueError, CheckpointError) as error:
            raise ConfigError(str(error)) from None
        self.num_envs, self.obs_dim = agent_cfg.num_envs, agent_cfg.obs_dim
        self.action_dim = agent_cfg.action_dim

        self.sync = StepSync(self.cfg.step_timeout)
        self.stats = EpisodeStats(self.num_envs)
        if checkpoint is not None:
            self.stats.load_state(checkpoint.extra.get("episodes", {}))
        self.counters = {
            "rejected_observations": 0,
            "rejected_rewards": 0,
            "rejected_dones": 0,
            "discarded_during_update": 0,
            "watchdog_trips": 0,
            "safe_actions_published": 0,
            "nonfinite_actions": 0,
            "save_failures": 0,
            "save_requests_refused": 0,
        }
        self._last_service_save = -math.inf
        self.last_save_error = ""
        self._save_errors_logged: set[tuple[str, int | None]] = set()
        self.state = State.WAITING
        self._warned_at: dict[str, float] = {}
        self._updates_run = 0
        self.last_metrics: dict[str, float] = {}
        self._latest_obs: tuple[np.ndarray, int] | None = None
        self._acted_stamp = 0
        """Reception stamp of the observation the latest action answered."""
        self._acted_by_sampling = False
        self._bootstrap_obs: np.ndarray | None = None
        self._episode_end_pending = np.zeros(self.num_envs, bool)
        self._episode_end_deadline = 0.0
        self._last_obs_time: float | None = None
        self._watchdog_tripped = False
        self._iteration_start = (time.perf_counter(), self.agent.env_steps)
        self._checkpoint_dir = Path(self.cfg.checkpoint_dir)
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
        action_type = (
            Float64MultiArray if self.cfg.action_msg_type == "float64" else Float32MultiArray
        )
        self._to_msg = to_float64_msg if action_type is Float64MultiArray else to_float32_msg
        self._action_pub = self.create_publisher(action_type, "action", qos)
        self._status_pub = self.create_publisher(String, "~/status", qos)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", qos)
        subscribe = _stamped_at_entry if arrival_ordered else _stamped_at_reception
        self._obs_sub = subscribe(
            self, Float32MultiArray, "observation", self._on_observation, qos
        )
        self._reward_sub = subscribe(self, Float32MultiArray, "reward", self._on_reward, qos)
        self._done_sub = subscribe(self, UInt8MultiArray, "done", self._on_done, qos)
        if self.cfg.control_services:
            self.create_service(Trigger, "~/save_checkpoint", self._srv_save)
            self.create_service(SetBool, "~/set_training", self._srv_set_training)
            self.create_service(SetBool, "~/set_deterministic", self._srv_set_deterministic)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._sim = SimPause(
            self,
            self.cfg.pause_service,
            self.cfg.resume_service,
            self.cfg.pause_service_type,
            self.cfg.service_timeout,
        )
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        # Step deadlines follow the node clock (a paused simulator drops nothing); the
        # watchdog follows the steady clock (it must fire even when sim time stops).
        self.create_timer(min(0.05, self.cfg.step_timeout / 4.0), self._check_step_deadline)
        self.create_timer(min(0.1, self.cfg.obs_timeout / 2.0), self._watchdog, clock=steady)
        self.create_timer(1.0, self._publish_status, clock=steady)
        self.get_logger().info(
            f"ready: {self.num_envs} envs x obs {self.obs_dim} -> action {self.action_dim}, "
            f"rollout {agent_cfg.num_steps} steps, iteration {self.agent.iteration}, "
            f"BLAS: {blas_description()}"
        )
        self._closed = False

    @property
    def finished(self) -> bool:
        return self.state is State.FINISHED

    # Message callbacks: convert, validate, hand over.

    def _read(
        self, kind: str, reader: Any, msg: Any, *shape: int, **limit: float
    ) -> np.ndarray | None:
        try:
            return reader(msg, *shape, **limit)
        except MessageError as error:
            self.counters[f"rejected_{kind}s"] += 1
            # Throttled per topic: rclpy throttles per call site, and one noisy topic
            # must not hide the others' problems.
            now = time.monotonic()
            if now - self._warned_at.get(kind, -math.inf) >= _WARN_PERIOD:
                self._warned_at[kind] = now
                self.get_logger().warning(
                    f"rejected {kind} ({self.counters[f'rejected_{kind}s']} so far): "
                    f"{error.reason}"
                )
            return None

    @_while_ros_runs
    def _on_observation(self, msg: Float32MultiArray, stamp: int) -> None:
        obs = self._read(
            "observation", read_matrix, msg, self.num_envs, self.obs_dim,
            limit=self.cfg.observation_limit,
        )
        if obs is None:
            return
        self._latest_obs = (obs, stamp)
        self._last_obs_time = time.monotonic()
        self._watchdog_tripped = False
        if self.state is State.WAITING:
            self.state = State.COLLECTING
        if self._collecting():
            result = self.sync.on_observation(obs, stamp)
            if isinstance(result, np.ndarray):
                self._act_on(result, stamp)
            else:
                self._handle(result)

    @_while_ros_runs
    def _on_reward(self, msg: Float32MultiArray, stamp: int) -> None:
        reward = self._read(
            "reward", read_vector, msg, self.num_envs, limit=self.cfg.reward_limit
        )
        if reward is not None and self._collecting():
            self._handle(self.sync.on_reward(reward, stamp))

    @_while_ros_runs
    def _on_done(self, msg: UInt8MultiArray, stamp: int) -> None:
        done = self._read("done", read_done_codes, msg, self.num_envs)
        if done is not None and self._collecting():
            self._handle(self.sync.on_done(done, stamp))

    def _collecting(self) -> bool:
        """True while steps are taken; a valid message that arrives during an update
        (e.g. while the simulator's pause is awaited) is counted as discarded."""
        if self.state is State.UPDATING:
            self.counters["discarded_during_update"] += 1
        return self.state in (State.COLLECTING, State.EPISODE_END)

    # Stepping.

    def _handle(self, result: Transition | None) -> None:
        if result is None:
            return
        self.stats.add(result.reward, result.done)
        if self.state is State.COLLECTING and self._learning and self._acted_by_sampling:
            if self.agent.record(result.obs, result.action, result.reward, result.done):
                self._bootstrap_obs = result.next_obs
                if self.cfg.update_trigger == "episode_end":
                    self.state = State.EPISODE_END
                    self._episode_end_pending[:] = True
                    self._episode_end_deadline = self._now() + self.cfg.episode_end_timeout
                else:
                    self._begin_update()
                    return
        # Not elif: an env whose episode ends on the step that fills the rollout has ended.
        if self.state is State.EPISODE_END:
            self._episode_end_pending &= result.done == 0
            if not self._episode_end_pending.any() or self._now() > self._episode_end_deadline:
                self._begin_update()
                return
        self._act_on(result.next_obs, self.sync.last_obs_stamp)

    @property
    def _learning(self) -> bool:
        return self.cfg.training and not self.cfg.deterministic

    def _act_on(self, obs: np.ndarray, stamp: int) -> None:
        actions = self.agent.act(obs, deterministic=self.cfg.deterministic)
        command = self.actions(actions)
        finite = bool(np.isfinite(command).all())
        if not finite:
            # Whatever the model holds, no NaN or Inf reaches the robot.
            command = self.actions.safe
            self._on_nonfinite_action()
        self._action_pub.publish(self._to_msg(command, ("env", "action")))
        self.sync.action_sent(obs, actions, stamp, self._now())
        self._acted_stamp = stamp
        # A mean action is no sample of the policy, nor is a safe action sent in its place:
        # PPO must not learn from their steps, even if deterministic mode is switched off
        # before the step completes.
        self._acted_by_sampling = finite and not self.cfg.deterministic

    def _on_nonfinite_action(self) -> None:
        self.counters["nonfinite_actions"] += 1
        restored = not all_finite(self.agent.model.parameters())
        if restored:
            self.agent.model.update(self._good_parameters)
        self.get_logger().error(
            f"the policy gave a non-finite action ({self.counters['nonfinite_actions']} so "
            "far): the safe action was sent instead"
            + ("; the last finite model parameters are restored" if restored else ""),
            throttle_duration_sec=_WARN_PERIOD,
        )

    def _keep_good_parameters(self) -> None:
        """Remember the model if it is finite (MLX arrays are immutable: references)."""
        parameters = self.agent.model.parameters()
        if all_finite(parameters):
            self._good_parameters = parameters

    def _publish_safe_action(self) -> None:
        self._action_pub.publish(self._to_msg(self.actions.safe, ("env", "action")))
        self.counters["safe_actions_published"] += 1

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _cut_segment(self) -> None:
        """The step stream broke: no return is computed across the gap."""
        self.agent.cut()
        self.stats.cut()

    @_while_ros_runs
    def _check_step_deadline(self) -> None:
        if self.sync.expired(self._now()):
            self._cut_segment()
            self.get_logger().warning(
                f"step not completed within step_timeout={self.cfg.step_timeout}s: dropped "
                f"({self.sync.counters['steps_dropped']} so far); the next observation "
                "starts a new segment",
                throttle_duration_sec=_WARN_PERIOD,
            )
            # The environment waits for an action at the state it published last: when
            # that came after the dropped step's observation, act on it now rather than
            # leave the robot to the watchdog (or stalled, with watchdog_safe_action off).
            if self._latest_obs is not None and self._latest_obs[1] > self._acted_stamp:
                self._act_on(*self._latest_obs)

    @_while_ros_runs
    def _watchdog(self) -> None:
        if self.state not in (State.COLLECTING, State.EPISODE_END) or self._last_obs_time is None:
            return
        if time.monotonic() - self._last_obs_time <= self.cfg.obs_timeout:
            return
        if not self._watchdog_tripped:
            self._watchdog_tripped = True
            self.counters["watchdog_trips"] += 1
            if self.sync.awaiting_step:
                self.sync.reset()
                self.sync.counters["steps_dropped"] += 1
                self._cut_segment()
            self.get_logger().warning(
                f"no observation for {self.cfg.obs_timeout}s: "
                + ("publishing the safe action" if self.cfg.watchdog_safe_action else "waiting")
            )
        if self.cfg.watchdog_safe_action:
            self._publish_safe_action()

    # Updating.

    def _begin_update(self) -> None:
        self.state = State.UPDATING
        self.sync.reset()
        self._publish_status()
        # Pause first: a safe action published before the pause answered could reach the
        # simulator first and step it, a step nobody learns from.
        self._sim.pause(then=self._run_update)

    def _run_update(self) -> None:
        assert self._bootstrap_obs is not None
        if self.cfg.update_safe_action:
            self._publish_safe_action()
        first_compile = self.agent.ppo_cfg.enable_compile and not self.cfg.warm_up_update
        if self._updates_run == 0 and first_compile:
            self.get_logger().info(
                "first update: MLX compiles its kernels (up to a minute on a new machine; "
                "cached on disk afterwards)"
            )
        metrics = self.agent.update(self._bootstrap_obs)
        if not self.context.ok():
            # A signal arrived during the update and shut ROS down: publishing or logging
            # to /rosout would fail now. close() saves the updated agent on the way out.
            return
        self._keep_good_parameters()
        self._updates_run += 1
        self._report_iteration(metrics)
        self.best.offer(self.agent, self.stats)
        interval = self.cfg.checkpoint_interval
        if interval and self.agent.iteration % interval == 0:
            self.save("interval")
        # Act only once the simulator runs again: an action that reached it still paused
        # would be dropped, and collection would stall until the step timed out.
        self._sim.resume(then=self._restart_collecting)

    def _restart_collecting(self) -> None:
        restart = self._drain_queued()
        if restart is None and self._latest_obs is not None:
            restart = self._latest_obs
        if self.cfg.max_iterations and self.agent.iteration >= self.cfg.max_iterations:
            self.save("max_iterations reached")
            self.state = State.FINISHED
            self.get_logger().info(f"finished {self.agent.iteration} iterations")
            return
        self.state = State.COLLECTING
        self._last_obs_time = time.monotonic()
        if restart is not None:
            self._act_on(*restart)

    def _drain_queued(self) -> tuple[np.ndarray, int] | None:
        """Discard what arrived during the update; return the newest valid observation.

        The executor could only deliver these after the update, mixed with the
        responses to the action that restarts collection; taking them here keeps
        them out of the buffer.
        """
        newest: tuple[np.ndarray, int] | None = None
        readers = (
            (self._obs_sub, "observation", read_matrix, (self.num_envs, self.obs_dim),
             {"limit": self.cfg.observation_limit}),
            (self._reward_sub, "reward", read_vector, (self.num_envs,),
             {"limit": self.cfg.reward_limit}),
            (self._done_sub, "done", read_done_codes, (self.num_envs,), {}),
        )
        for sub, kind, reader, shape, limit in readers:
            while (taken := _take(sub)) is not None:
                msg, info = taken
                self.counters["discarded_during_update"] += 1
                # Bad input is bad input whenever it comes: counted (and logged) as such.
                value = self._read(kind, reader, msg, *shape, **limit)
                if value is not None and sub is self._obs_sub:
                    newest = (value, info["received_timestamp"])
        if newest is not None:
            self._latest_obs = newest
        return newest

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
            **{k: float(v) for k, v in self.sync.counters.items()},
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
            f"dropped {self.sync.counters['steps_dropped']} "
            f"rejected {sum(v for k, v in self.counters.items() if k.startswith('rejected'))}"
        )

    def _publish_diagnostics(self, values: dict[str, float]) -> None:
        problems = self.sync.counters["steps_dropped"] + self.counters["rejected_observations"]
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
            "state": self.state.value,
            "iteration": self.agent.iteration,
            "env_steps": self.agent.env_steps,
            "buffer_steps": self.agent.buffer.step,
            "training": self.cfg.training,
            "deterministic": self.cfg.deterministic,
            # JSON has no NaN (strict parsers refuse it): no episode yet reads null.
            "mean_return": _json_number(self.stats.mean_return),
            "sim_service_failures": self._sim.calls_failed,
            "metrics_log_failures": self._log.failures,
            "last_save_error": self.last_save_error,
            **self.sync.counters,
            **self.counters,
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
            self.counters["save_failures"] += 1
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
            self.counters["save_requests_refused"] += 1
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

    def _srv_set_training(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("training", request.data, response)

    def _srv_set_deterministic(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        return self._set_by_service("deterministic", request.data, response)

    def _set_by_service(self, name: str, value: bool, response: SetBool.Response) -> Any:
        """The services set the parameter, so both always agree (one path: the callback)."""
        result = self.set_parameters([Parameter(name, value=bool(value))])[0]
        response.success = result.successful
        response.message = f"{name}={getattr(self.cfg, name)}" + (
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
                if self.cfg.training and not param.value:
                    self.agent.cut()
                self.cfg.training = bool(param.value)
            elif param.name == "deterministic":
                # Mean actions are not samples of the policy: PPO must not learn from them.
                if param.value and not self.cfg.deterministic:
                    self.agent.cut()
                self.cfg.deterministic = bool(param.value)
            elif param.name == "ppo.learning_rate":
                # The adaptive schedule goes on from this rate.
                self.agent.trainer.learning_rate = float(param.value)
                self.agent.ppo_cfg.learning_rate = float(param.value)
            else:
                continue
            self.get_logger().info(f"parameter {param.name} set to {param.value}")
        return SetParametersResult(successful=True)

    def close(self) -> None:
        """Save on the way out (shutdown, signal, or the last iteration); once."""
        if self._closed:
            return
        self._closed = True
        if self.state is not State.FINISHED and self.agent.iteration > 0:
            self.save("shutdown")
        self._log.close()

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()


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
