"""One trainer, several robots: the fleet's collect/update state machine, ROS-free.

Each robot is an environment of ``num_envs`` rows speaking the topic contract under its
own namespace; it has its own step synchroniser, action guard and watchdog, and steps at
its own pace: the policy acts on a robot's observation as soon as its step is complete,
and nobody waits for anybody. Robot r's envs are rows r*n..(r+1)*n-1 of the agent's
``num_envs`` (robots x n). Its steps go into the shared rollout through ``LaneRollout``,
so the rollout holds only steps that were taken.

A robot whose step misses ``step_timeout`` is stalled: its episodes in progress are cut
(time-out bootstrap on its last stored steps, not logged), its lanes are left to the
others, and the rollout completes without it. Its next observation (a restarted
robot's first one, or a re-published one) rejoins it: the policy acts on it, and its
steps are stored again from there. Times and stamps are as in ``training_loop``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_ros.action_safety import ActionGuard, ActionSafetyConfig
from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.agent import PPOAgent, StepOfEnvs
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.checkpoint import all_finite
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.lanes import LaneRollout
from unilab_ros.stepper import SegmentStart, StepSync, Transition
from unilab_ros.training_loop import (
    COUNTERS,
    BeginUpdate,
    Finished,
    LoopBase,
    LoopConfig,
    Phase,
    PublishAction,
)
from unilab_ros.watchdog import Silence, Watchdog, WatchdogConfig

FLEET_COUNTERS = ("robot_stalls", "robot_rejoins")
"""The fleet's counters besides the single-robot ones."""


@dataclass(frozen=True)
class RobotAction:
    """Publish ``action`` to robot ``robot`` (an index into the robot list)."""

    robot: int
    action: PublishAction
    rejoined: bool = False
    """The robot was stalled: this is its first action since."""


@dataclass(frozen=True)
class RobotStalled:
    """Robot ``robot`` missed ``step_timeout`` (or, with ``pause_unanswered``, its
    simulator did not answer a pause); ``then`` acts on a newer observation it waits at,
    if there is one."""

    robot: int
    then: PublishAction | None
    pause_unanswered: bool = False


@dataclass(frozen=True)
class RobotSilence:
    robot: int
    silence: Silence


FleetDecision = RobotAction | BeginUpdate | None


class _Robot:
    """What the fleet keeps of one robot."""

    def __init__(
        self, name: str, envs: np.ndarray, cfg: LoopConfig, guard: ActionGuard,
        watchdog: WatchdogConfig,
    ) -> None:
        self.name = name
        self.envs = envs
        self.sync = StepSync(cfg.step_timeout)
        self.guard = guard
        self.watchdog = Watchdog(watchdog)
        self.latest_obs: tuple[np.ndarray, int] | None = None
        self.acted_stamp = 0
        self.acted_by_sampling = False
        self.acted_in_estop = False
        self.policy_outputs: tuple[np.ndarray, np.ndarray] | None = None
        """Mean and std of the policy's latest action for this robot."""
        self.stalled = False
        self.heard = 0.0
        """Node-clock time of its latest valid message."""


class FleetLoop(LoopBase):
    """The trainer's decisions for a fleet of robots; see the module docstring."""

    def __init__(
        self,
        cfg: LoopConfig,
        agent: PPOAgent,
        actions: ActionMapper,
        robots: list[str],
        stats: EpisodeStats | None = None,
        best: BestPolicy | None = None,
        watchdog: WatchdogConfig | None = None,
        safety: ActionSafetyConfig | None = None,
    ) -> None:
        """``actions`` maps one robot's rows (``num_envs`` = the agent's / robots)."""
        super().__init__(cfg, agent, actions, stats, best, COUNTERS + FLEET_COUNTERS)
        if cfg.update_trigger != "rollout_full":
            # episode_end waits for every env's episode: a stalled robot's never ends.
            raise ValueError("a fleet updates when the rollout is full (update_trigger)")
        per_robot, rest = divmod(agent.cfg.num_envs, len(robots))
        if rest or per_robot != actions.safe.shape[0]:
            raise ValueError("the agent's num_envs must be robots x the robots' num_envs")
        self.robots = [
            _Robot(name, np.arange(r * per_robot, (r + 1) * per_robot),
                   cfg, ActionGuard(safety or ActionSafetyConfig(), actions.safe),
                   watchdog or WatchdogConfig())
            for r, name in enumerate(robots)
        ]
        for robot in self.robots:
            # Each robot stood at the safe action before its first command: blend in.
            robot.guard.hold()
        self.lanes = LaneRollout(agent)
        self._update_began = 0.0

    @property
    def step_counters(self) -> dict[str, int]:
        """The robots' synchroniser counters, summed."""
        total = dict.fromkeys(self.robots[0].sync.counters, 0)
        for robot in self.robots:
            for name, value in robot.sync.counters.items():
                total[name] += value
        return total

    @property
    def stalled_robots(self) -> list[str]:
        return [robot.name for robot in self.robots if robot.stalled]

    def simulators_to_pause(self) -> list[int]:
        """Not a stalled robot's: none of its steps are taken, and a dead process's service
        can look ready for a while, so each call would wait service_timeout."""
        return [r for r, robot in enumerate(self.robots) if not robot.stalled]

    # Steps.

    def on_observation(
        self, r: int, obs: np.ndarray, stamp: int, now: float, steady: float
    ) -> FleetDecision:
        """A valid observation of robot ``r``."""
        robot = self.robots[r]
        robot.latest_obs = (obs, stamp)
        robot.heard = now
        robot.watchdog.observed(steady)
        if self.phase is Phase.WAITING:
            self.phase = Phase.COLLECTING
        if not self._collecting():
            return None
        match robot.sync.on_observation(obs, stamp):
            case SegmentStart(obs=start, stamp=start_stamp):
                return self._act(r, start, start_stamp, now)
            case Transition() as step:
                return self._complete(r, step, now)
        return None

    def on_reward(self, r: int, reward: np.ndarray, stamp: int, now: float) -> FleetDecision:
        self.robots[r].heard = now
        if not self._collecting():
            return None
        return self._complete(r, self.robots[r].sync.on_reward(reward, stamp), now)

    def on_done(self, r: int, done: np.ndarray, stamp: int, now: float) -> FleetDecision:
        self.robots[r].heard = now
        if not self._collecting():
            return None
        return self._complete(r, self.robots[r].sync.on_done(done, stamp), now)

    def _collecting(self) -> bool:
        if self.phase is Phase.UPDATING:
            self.count("discarded_during_update")
        return self.phase is Phase.COLLECTING

    def _complete(self, r: int, step: Transition | None, now: float) -> FleetDecision:
        if step is None:
            return None
        robot = self.robots[r]
        if robot.acted_in_estop:
            return self._act(r, step.next_obs, step.next_obs_stamp, now)
        self.stats.add(step.reward, step.done, robot.envs)
        if self.learning and robot.acted_by_sampling and robot.policy_outputs is not None:
            mean, std = robot.policy_outputs
            stored = StepOfEnvs(step.obs, step.action, mean, std, step.reward, step.done)
            if self.lanes.record(robot.envs, stored, step.next_obs):
                self.phase = Phase.UPDATING
                self._update_began = now
                for each in self.robots:
                    each.sync.reset()
                return BeginUpdate()
        return self._act(r, step.next_obs, step.next_obs_stamp, now)

    def _act(self, r: int, obs: np.ndarray, stamp: int, now: float) -> RobotAction:
        robot = self.robots[r]
        rejoined = robot.stalled
        if rejoined:
            robot.stalled = False
            self.count("robot_rejoins")
        robot.acted_stamp = stamp
        robot.acted_in_estop = self.estop
        if self.estop:
            robot.acted_by_sampling = False
            command = robot.guard.hold()
            robot.sync.action_sent(obs, self._in_policy_units(command), stamp, now)
            return RobotAction(r, PublishAction(command, estop=True), rejoined)
        actions = self.agent.act(obs, deterministic=self.cfg.deterministic)
        sampler = self.agent.sampler
        robot.policy_outputs = (sampler.last_mean, sampler.last_std)
        mapped = self.actions(actions)
        finite = bool(np.isfinite(mapped).all())
        restored = False
        if finite:
            command = robot.guard(mapped)
            changed = command != mapped
            if changed.any():
                # What was sent is what PPO learns from (see TrainingLoop._as_sent).
                self.count("guarded_actions")
                actions = np.where(
                    changed, self._in_policy_units(command), actions).astype(np.float32)
        else:
            command = robot.guard.hold()
            self.count("nonfinite_actions")
            restored = not all_finite(self.agent.model.parameters())
            if restored:
                self.agent.model.update(self._good_parameters)
        robot.sync.action_sent(obs, actions, stamp, now)
        robot.acted_by_sampling = finite and not self.cfg.deterministic
        return RobotAction(r, PublishAction(command, not finite, restored), rejoined)

    def _cut(self, robot: _Robot) -> None:
        """Robot's step stream broke: its episodes are cut, its lanes free."""
        self.lanes.cut(robot.envs)
        self.stats.cut(robot.envs)

    def _stall(self, robot: _Robot) -> None:
        self._cut(robot)
        if not robot.stalled:
            robot.stalled = True
            self.count("robot_stalls")

    def check_step_deadlines(self, now: float) -> list[RobotStalled]:
        """Drop each robot's late step: that robot stalls, the others go on."""
        stalled = []
        for r, robot in enumerate(self.robots):
            if not robot.sync.expired(now):
                continue
            self._stall(robot)
            latest = robot.latest_obs
            then = None
            if latest is not None and latest[1] > robot.acted_stamp:
                then = self._act(r, *latest, now).action
            stalled.append(RobotStalled(r, then))
        return stalled

    def pause_unanswered(self, r: int) -> RobotStalled | None:
        """Robot ``r``'s simulator did not answer its pause before an update: it stalls
        now. Its free lanes fill from the others before its step can time out, and a dead
        process's service can look ready for a while, so otherwise every update would
        wait on it again."""
        robot = self.robots[r]
        if robot.stalled:
            return None
        self._stall(robot)
        return RobotStalled(r, None, pause_unanswered=True)

    def check_watchdogs(self, steady: float) -> list[RobotSilence]:
        """The robots whose observations stopped while collecting."""
        if self.phase is not Phase.COLLECTING:
            return []
        silences = []
        for r, robot in enumerate(self.robots):
            silence = robot.watchdog.check(steady)
            if silence is None:
                continue
            if silence.publish_safe:
                robot.guard.hold()
            if silence.first:
                self.count("watchdog_trips")
                if robot.sync.drop():
                    self._cut(robot)
            silences.append(RobotSilence(r, silence))
        return silences

    # Updates.

    def update(self) -> dict[str, float]:
        """The PPO update on the collected rollout; its metrics."""
        metrics = self._update_from(self.lanes.bootstrap_obs)
        self.lanes.clear()
        return metrics

    def resume(
        self, now: float, steady: float
    ) -> list[RobotAction | RobotStalled] | Finished:
        """The simulators run again: act on each live robot's newest observation; a robot
        silent for ``step_timeout`` before the update stalls (its step, cut short by the
        update, could not time out: the rollouts may fill faster than that)."""
        if self._finished():
            return Finished()
        self.phase = Phase.COLLECTING
        decisions: list[RobotAction | RobotStalled] = []
        for r, robot in enumerate(self.robots):
            robot.watchdog.observed(steady)
            robot.guard.hold()
            if robot.latest_obs is None or robot.stalled:
                # A stalled robot rejoins on an observation of its own, not on a stale one.
                continue
            if self._update_began - robot.heard > self.cfg.step_timeout:
                self._stall(robot)
                decisions.append(RobotStalled(r, None))
                continue
            decisions.append(self._act(r, *robot.latest_obs, now))
        return decisions

    # The emergency stop and live switches.

    def set_estop(self, engaged: bool) -> list[RobotAction]:
        """Engage (the safe action to every robot at once) or release the e-stop."""
        if engaged == self.estop:
            return self._hold_all() if engaged else []
        self.estop = engaged
        self.stats.cut()
        for robot in self.robots:
            robot.sync.reset()
            if self.phase is Phase.COLLECTING:
                self.lanes.cut(robot.envs)
        if not engaged:
            for robot in self.robots:
                robot.guard.hold()
            return []
        self.count("estops")
        return self._hold_all()

    def _hold_all(self) -> list[RobotAction]:
        return [RobotAction(r, PublishAction(robot.guard.hold(), estop=True))
                for r, robot in enumerate(self.robots)]

    def _cut_rollout(self) -> None:
        for robot in self.robots:
            self.lanes.cut(robot.envs)
