"""Serve any Gymnasium environment over the unilab_ros topic contract.

`num_envs` copies of `env_id` step together (SyncVectorEnv). The node publishes the first
`observation` alone. Each valid action then steps every env and publishes `reward`, `done`
and the next `observation`, in that order. Whenever no action has come for
`republish_period`, the latest observation is published again, so a trainer started
later, or restarted while the environment runs on, still gets the state to act on (the
trainer drops a copy of a state it already acted on). Only Box observation and Box
action spaces are served.

`~/pause` and `~/resume` (std_srvs/Empty) stop and restart the simulation, as Gazebo's
/pause_physics and /unpause_physics do: while paused, actions are counted and dropped and
nothing is published; resume publishes nothing either, so the next action steps from the
state published last.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
from rclpy.node import Node
from std_msgs.msg import Float32MultiArray, Float64MultiArray, String, UInt8MultiArray
from std_srvs.srv import Empty

from unilab_ros.loop.counters import Counters
from unilab_ros.ros.executors import run_node
from unilab_ros.ros.messages import (
    MessageError,
    read_matrix,
    to_float32_msg,
    to_uint8_msg,
)
from unilab_ros.ros.params import ConfigError, declare_config, read_config, warn_unknown_parameters
from unilab_ros.sims.gym_vector import RETURN_WINDOW, GymEnvConfigError, GymVectorSim

NODE_NAME = 'gym_env'
ACTION_MSG_TYPES = {'float32': Float32MultiArray, 'float64': Float64MultiArray}
REJECT_LOG_PERIOD_S = 2.0
PAUSED_LOG_PERIOD_S = 10.0
LATENCY_WINDOW = 1000
"""Steps whose observation -> action latency the status and the log line summarize."""


@dataclass(frozen=True)
class GymEnvParams:
    """The node's parameters; the defaults here are the only ones (YAML only overrides)."""

    env_id: str = 'Pendulum-v1'
    """Any registered Gymnasium id with Box observation and action spaces."""
    num_envs: int = 1
    """Copies stepped together: the rows of every message."""
    seed: int = 0
    """Env i is reset with seed + i at start-up."""
    max_episode_steps: int = 0
    """Time limit (done code 2) per episode; 0 keeps the env's registered limit."""
    republish_period: float = 0.5
    """Seconds without an action after which the latest observation is published again
    (and again every period); 0 disables."""
    max_pause: float = 30.0
    """Seconds a pause may last without a resume; then the env resumes on its own with a
    warning (the trainer that paused it is gone: killed in an update, or it paused a
    previous run of this bridge). 0: a pause lasts until resumed."""
    action_msg_type: str = 'float32'
    """'float32' (Float32MultiArray) or 'float64' (Float64MultiArray, as ros2_control)."""
    qos_depth: int = 10
    """History depth of the observation / reward / done / action topics."""
    log_period: float = 10.0
    """Seconds between ~/status messages and episode-return log lines."""

    def validate(self) -> None:
        """Raise ValueError naming every out-of-range value."""
        problems = []
        if self.num_envs < 1:
            problems.append(f'num_envs must be >= 1, got {self.num_envs}')
        if self.max_episode_steps < 0:
            problems.append(f'max_episode_steps must be >= 0, got {self.max_episode_steps}')
        if self.republish_period < 0:
            problems.append(f'republish_period must be >= 0 s, got {self.republish_period}')
        if self.max_pause < 0:
            problems.append(f'max_pause must be >= 0 s, got {self.max_pause}')
        if self.action_msg_type not in ACTION_MSG_TYPES:
            problems.append(f'action_msg_type must be one of {sorted(ACTION_MSG_TYPES)}, '
                            f'got {self.action_msg_type!r}')
        if self.qos_depth < 1:
            problems.append(f'qos_depth must be >= 1, got {self.qos_depth}')
        if self.log_period <= 0:
            problems.append(f'log_period must be > 0 s, got {self.log_period}')
        if problems:
            raise ValueError('; '.join(problems))


EVENT_COUNTERS = ('rejected_actions', 'actions_while_paused', 'observation_republishes',
                  'pause_timeouts')
"""What the bridge counts besides the env's steps and episodes."""


@dataclass(frozen=True)
class GymEnvStatus:
    """A snapshot of the bridge's state (status topic and tests)."""

    steps: int
    episodes: int
    rejected_actions: int
    actions_while_paused: int
    observation_republishes: int
    pause_timeouts: int
    mean_return: float | None
    latency_p50_ms: float | None = None
    """Median ms from publishing a step's observation to receiving the action that answers
    it, over the last LATENCY_WINDOW steps (none held by a pause): the trainer's
    observation -> action path through ROS as the environment sees it."""
    latency_p99_ms: float | None = None


class GymEnvNode(Node):
    """Publishes observation / reward / done of a Gymnasium vector env, steps it on `action`."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        try:
            self._setup()
        except (GymEnvConfigError, ConfigError):
            self.destroy_node()
            raise

    def _setup(self) -> None:
        declare_config(self, GymEnvParams())
        warn_unknown_parameters(self)
        params = read_config(self, GymEnvParams)
        self._sim = GymVectorSim(params.env_id, params.num_envs, params.seed,
                                 params.max_episode_steps)
        self._counts = Counters(EVENT_COUNTERS)
        self._paused = False
        self._paused_since = 0.0
        self._max_pause = params.max_pause
        self._logged_episodes = 0
        self._logged_steps = 0
        self._observed_at: float | None = None
        """When the latest step's observation went out; None once answered or paused."""
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

        self._observation_pub = self.create_publisher(Float32MultiArray, 'observation',
                                                      params.qos_depth)
        self._reward_pub = self.create_publisher(Float32MultiArray, 'reward', params.qos_depth)
        self._done_pub = self.create_publisher(UInt8MultiArray, 'done', params.qos_depth)
        self._status_pub = self.create_publisher(String, '~/status', 10)
        self.create_subscription(ACTION_MSG_TYPES[params.action_msg_type], 'action',
                                 self._on_action, params.qos_depth)
        self.create_service(Empty, '~/pause', self._srv_pause)
        self.create_service(Empty, '~/resume', self._srv_resume)

        self._republish_period = params.republish_period
        self._latest_observation = to_float32_msg(self._sim.reset(), ('env', 'obs'))
        self._observation_pub.publish(self._latest_observation)
        self._quiet_since = time.monotonic()
        if params.republish_period > 0:
            # Checked four times a period, so a re-publication is late by a quarter at most.
            self.create_timer(params.republish_period / 4.0, self._republish_if_quiet)
        self.create_timer(params.log_period, self._report)
        if params.max_pause > 0:
            self.create_timer(min(1.0, params.max_pause / 4.0), self._end_a_stale_pause)
        self.get_logger().info(
            f'serving {params.num_envs} x {params.env_id}: obs_dim={self._sim.obs_dim}, '
            f'action_dim={self._sim.action_dim}, action type {params.action_msg_type}')

    @property
    def status(self) -> GymEnvStatus:
        p50 = p99 = None
        if self._latencies:
            p50, p99 = (float(v) * 1e3 for v in np.percentile(self._latencies, [50, 99]))
        return GymEnvStatus(steps=self._sim.steps, episodes=self._sim.episodes,
                            mean_return=self._sim.mean_return(), latency_p50_ms=p50,
                            latency_p99_ms=p99, **self._counts)

    @property
    def waiting_for_first_action(self) -> bool:
        return self._sim.steps == 0

    @property
    def paused(self) -> bool:
        return self._paused

    def destroy_node(self) -> None:
        if getattr(self, '_sim', None) is not None:
            self._sim.close()
            self._sim = None
        super().destroy_node()

    def _republish_if_quiet(self) -> None:
        # Paused, the simulation publishes nothing: a trainer that saw a state now would act
        # on it, and its action would be dropped.
        now = time.monotonic()
        if self._paused or now - self._quiet_since < self._republish_period:
            return
        self._observation_pub.publish(self._latest_observation)
        self._counts.add('observation_republishes')
        # An answer now came after a lost message, not down the usual path: no sample.
        self._observed_at = None
        self._quiet_since = now

    def _on_action(self, msg: Float32MultiArray | Float64MultiArray) -> None:
        if self._paused:
            dropped = self._counts.add('actions_while_paused')
            self.get_logger().info(
                f'paused: action dropped, env not stepped ({dropped} so far)',
                throttle_duration_sec=PAUSED_LOG_PERIOD_S)
            return
        received = time.perf_counter()
        try:
            actions = read_matrix(msg, self._sim.num_envs, self._sim.action_dim)
        except MessageError as error:
            self._reject(error.reason)
            return
        if self._observed_at is not None:
            self._latencies.append(received - self._observed_at)
        result = self._sim.step(actions)
        self._reward_pub.publish(to_float32_msg(result.reward, ('env',)))
        self._done_pub.publish(to_uint8_msg(result.done, ('env',)))
        self._latest_observation = to_float32_msg(result.observation, ('env', 'obs'))
        self._observed_at = time.perf_counter()
        self._observation_pub.publish(self._latest_observation)
        self._quiet_since = time.monotonic()

    def _reject(self, reason: str) -> None:
        rejected = self._counts.add('rejected_actions')
        self.get_logger().warning(
            f'rejected action, env not stepped ({rejected} so far): {reason}',
            throttle_duration_sec=REJECT_LOG_PERIOD_S)

    def _srv_pause(self, _request: Empty.Request, response: Empty.Response) -> Empty.Response:
        # Counted from the first of repeated pauses: a trainer that keeps pausing and
        # never resumes must not hold the env forever.
        if not self._paused:
            self._paused_since = time.monotonic()
        self._paused = True
        # The answer to the latest observation waits for the update: no latency sample.
        self._observed_at = None
        return response

    def _end_a_stale_pause(self) -> None:
        if not self._paused or time.monotonic() - self._paused_since <= self._max_pause:
            return
        timeouts = self._counts.add('pause_timeouts')
        self.get_logger().warning(
            f'paused for over {self._max_pause}s with no resume: resuming '
            f'({timeouts} so far; the trainer that paused it is gone?)')
        self._resume()
        # A trainer that is waiting gets the state now, not a republish_period later.
        self._observation_pub.publish(self._latest_observation)
        self._quiet_since = time.monotonic()

    def _srv_resume(self, _request: Empty.Request, response: Empty.Response) -> Empty.Response:
        self._resume()
        return response

    def _resume(self) -> None:
        if self._paused:
            # Time paused is not quiet time: after an update the trainer acts on the state
            # it has, and a bridge that stepped just before the pause waits its whole
            # period again. But one the trainer does not act on (it joined a fleet after
            # its first state was lost) must still re-publish after a period of running
            # time, even when updates pause it more often than that.
            self._quiet_since += time.monotonic() - self._paused_since
        self._paused = False

    def _report(self) -> None:
        status = self.status
        self._status_pub.publish(
            String(data=json.dumps({**asdict(status), 'paused': self._paused})))
        new_episodes = status.episodes - self._logged_episodes
        latency = ('' if status.latency_p50_ms is None else
                   f'; observation -> action {status.latency_p50_ms:.2f} ms p50, '
                   f'{status.latency_p99_ms:.2f} ms p99')
        if new_episodes == 0:
            # Long episodes (1,000 steps) end rarely: the latency is still worth a line.
            if latency and status.steps != self._logged_steps:
                self._logged_steps = status.steps
                self.get_logger().info(f'{status.steps} steps, no episode ended' + latency)
            return
        self._logged_episodes, self._logged_steps = status.episodes, status.steps
        self.get_logger().info(
            f'{status.steps} steps, {status.episodes} episodes; mean return of the last '
            f'{min(new_episodes, RETURN_WINDOW)}: {self._sim.mean_return(new_episodes):.3f}'
            + latency)


def main(args: list[str] | None = None) -> None:
    run_node(NODE_NAME, lambda _ordered: GymEnvNode(), args, (GymEnvConfigError, ConfigError))


if __name__ == '__main__':
    main()
