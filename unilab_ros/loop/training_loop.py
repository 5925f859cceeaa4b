"""The trainer's collect/update state machine for one robot or a fleet, ROS-free.

``TrainingLoop`` owns what the trainer decides: episode statistics, the agent, whether a
step is learned from, the episode-end wait, when to update and save, and what a late
step, a silent robot or an e-stop mean. Its caller (the trainer node, or the in-process
run) converts messages, keeps the clocks and carries out the returned decisions.

Each robot (``robot_state.Robot``) is an environment of ``n`` rows with its own step source,
action guard and watchdog, and steps at its own pace: the policy acts on a robot's
observation as soon as its step is complete, and nobody waits for anybody. Robot r's
envs are rows r*n..(r+1)*n-1 of the agent's ``num_envs``; its steps go into the shared
rollout through the agent's collector (``rl.algorithm``: PPO's ``LaneRollout``, or the
off-policy learner's replay), so it holds only steps that were taken. One
robot is the plain case: its lanes are the rollout's columns.

A robot whose step misses ``step_timeout`` stalls: its episodes in progress are cut
(time-out bootstrap on its last stored steps, not logged), a fleet's other robots fill
its free lanes, and its next observation (a restarted robot's first, or a re-published
one) rejoins it. ``episode_end`` (finish every env's episode before updating) needs one
robot: a stalled robot's episodes never end.

Times: ``now`` is the node clock (sim time under use_sim_time) in seconds, ``steady`` a
steady clock in seconds, ``stamp`` a message's reception time in ns.
"""

from __future__ import annotations

import numpy as np

from unilab_ros.loop.action_safety import ActionGuard, ActionSafetyConfig
from unilab_ros.loop.action_units import as_sent, in_policy_units
from unilab_ros.loop.beside_acting import BesideActing
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.counters import Counters
from unilab_ros.loop.decisions import (
    BeginUpdate,
    Decision,
    Finished,
    PublishAction,
    Save,
    StepDropped,
)
from unilab_ros.loop.robot_checks import RobotChecks
from unilab_ros.loop.robot_state import Robot
from unilab_ros.loop.states import COUNTERS, FLEET_COUNTERS, Phase
from unilab_ros.loop.step_sync import StepSync
from unilab_ros.loop.steps import SegmentStart, StepSource, Transition
from unilab_ros.loop.watchdog import Watchdog, WatchdogConfig
from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.agent import StepOfEnvs
from unilab_ros.rl.algorithm import (
    Agent,
    acted_outputs,
    collector,
    learn_beside_acting,
    model_lock,
)
from unilab_ros.rl.background_update import BackgroundUpdate
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.checkpoint import all_finite
from unilab_ros.rl.episodes import EpisodeStats


class TrainingLoop(RobotChecks, BesideActing):
    """The trainer's decisions over one training session; see the module docstring."""

    def __init__(
        self,
        cfg: LoopConfig,
        agent: Agent,
        actions: ActionMapper,
        robots: list[str] | None = None,
        stats: EpisodeStats | None = None,
        best: BestPolicy | None = None,
        watchdog: WatchdogConfig | None = None,
        safety: ActionSafetyConfig | None = None,
        sources: list[StepSource] | None = None,
    ) -> None:
        """``robots``: a fleet's namespaces (none: one robot on the trainer's own topics);
        ``actions`` maps one robot's rows (``num_envs`` = the agent's / robots);
        ``sources``: each robot's step source (none: the topic contract's ``StepSync``),
        whose events the caller hands to ``on_step``."""
        cfg.validate()
        self.fleet = bool(robots)
        names = list(robots) if robots else [""]
        if self.fleet and cfg.update_trigger != "rollout_full":
            raise ValueError("a fleet updates when the rollout is full (update_trigger)")
        per_robot, rest = divmod(agent.cfg.num_envs, len(names))
        if rest or per_robot != actions.safe.shape[0]:
            raise ValueError("the agent's num_envs must be robots x the robots' num_envs")
        self.cfg = cfg
        self.agent = agent
        self.actions = actions
        self.stats = stats or EpisodeStats(agent.cfg.num_envs)
        self.best = best
        self.counters = Counters(COUNTERS + (FLEET_COUNTERS if self.fleet else ()))
        if sources is not None and len(sources) != len(names):
            raise ValueError(f"{len(sources)} step sources for {len(names)} robots")
        self.robots = [
            Robot(name, np.arange(r * per_robot, (r + 1) * per_robot),
                  sources[r] if sources is not None else StepSync(cfg.step_timeout),
                  ActionGuard(safety or ActionSafetyConfig(), actions.safe),
                  Watchdog(watchdog or WatchdogConfig()))
            for r, name in enumerate(names)
        ]
        for robot in self.robots:
            # Each robot stood at the safe action before its first command: blend in.
            robot.guard.hold()
        self.lanes = collector(agent)
        self.learner = (learn_beside_acting(agent, cfg.learner_process, cfg.learner_cpu)
                        if cfg.learn_while_acting else None)
        """The learner thread while learning runs beside acting."""
        self._stale_steps = 0
        """PPO beside acting: steps of the rollout being collected that were acted on
        while the previous update ran (one update behind when learned from)."""
        self._handed_over_lag = 0.0
        """The policy lag (in updates) of the rollout the running update learns from."""
        self.estop = False
        self.phase = Phase.WAITING
        self.updates_run = 0
        self._good_parameters = agent.model.parameters()
        self._update_began = 0.0
        self._episode_end_pending = np.zeros(agent.cfg.num_envs, bool)
        self._episode_end_deadline = 0.0

    @property
    def learning(self) -> bool:
        return self.cfg.training and not self.cfg.deterministic

    @property
    def step_counters(self) -> Counters:
        """The robots' step-source counters, summed."""
        return Counters.summed(robot.source.counters for robot in self.robots)

    @property
    def stalled_robots(self) -> list[str]:
        return [robot.name for robot in self.robots if robot.stalled]

    @property
    def stored_steps(self) -> int:
        """Steps of the rollout every env has stored so far."""
        return int(self.lanes.filled.min())

    def simulators_to_pause(self) -> list[int]:
        """The robots whose simulators are paused around an update: not a stalled robot's
        (none of its steps are taken, and a dead process's service can look ready for a
        while, so each call would wait service_timeout)."""
        return [r for r, robot in enumerate(self.robots) if not robot.stalled]

    # Steps: the topic contract's messages go through each robot's StepSync; another
    # step source hands its events to ``step``.

    def on_observation(
        self, r: int, obs: np.ndarray, stamp: int, now: float, steady: float
    ) -> list[Decision]:
        """A valid observation of robot ``r``. A copy of its latest one (an environment
        re-publishing the state it waits at) is no sign of life for the watchdog unless the
        loop acts on it: with a lost message and a stopped clock, copies would keep the
        watchdog from ever tripping."""
        robot = self.robots[r]
        if robot.latest_obs is None or not np.array_equal(obs, robot.latest_obs[0]):
            robot.watchdog.observed(steady)
        robot.latest_obs = (obs, stamp)
        robot.heard = now
        if self.phase is Phase.WAITING:
            self.phase = Phase.COLLECTING
        if not self._collecting():
            return []
        event = robot.source.on_observation(obs, stamp)
        if isinstance(event, SegmentStart):
            # Acting again on the state the robot waits at: the silence, if any, ends.
            robot.watchdog.observed(steady)
        return self.step(r, event, now)

    def on_reward(self, r: int, reward: np.ndarray, stamp: int, now: float) -> list[Decision]:
        """A valid reward of robot ``r``."""
        robot = self.robots[r]
        robot.heard = now
        if not self._collecting():
            return []
        return self.step(r, robot.source.on_reward(reward, stamp), now)

    def on_done(self, r: int, done: np.ndarray, stamp: int, now: float) -> list[Decision]:
        """A valid done-code vector of robot ``r``."""
        robot = self.robots[r]
        robot.heard = now
        if not self._collecting():
            return []
        return self.step(r, robot.source.on_done(done, stamp), now)

    def step(
        self, r: int, event: SegmentStart | Transition | None, now: float
    ) -> list[Decision]:
        """Robot ``r``'s step source says a segment starts (act on its observation) or a
        step completed (learn from it, then act on the next observation)."""
        match event:
            case SegmentStart(obs=obs, stamp=stamp):
                return [self._act(r, obs, stamp, now)]
            case Transition() as step:
                return self._complete(r, step, now)
        return []

    def on_step(
        self, r: int, event: SegmentStart | Transition | None, now: float, steady: float
    ) -> list[Decision]:
        """A tick of robot ``r``'s clocked step source (a robot spec's): ``event`` as
        ``step`` takes it, or None (stale data, or waiting for a reset or fresh data). The
        source judges its data itself: a tick is the watchdog's sign of life, which trips
        only when ticks stop (a stopped clock). No ``latest_obs`` is kept: a free-running
        robot has moved on after an update or a dropped step; the next tick starts anew."""
        robot = self.robots[r]
        robot.watchdog.observed(steady)
        if event is None:
            return []
        robot.heard = now
        if self.phase is Phase.WAITING:
            self.phase = Phase.COLLECTING
        if not self._collecting():
            return []
        return self.step(r, event, now)

    def hold(self, r: int) -> np.ndarray:
        """Robot ``r`` gets the safe action now; the policy blends in from it."""
        return self.robots[r].guard.hold()

    def _collecting(self) -> bool:
        """True while steps are taken; a valid message that arrives during an update
        (e.g. while the simulator's pause is awaited) is counted as discarded."""
        if self.phase is Phase.UPDATING:
            self.counters.add("discarded_during_update")
        return self.phase in (Phase.COLLECTING, Phase.EPISODE_END)

    def _complete(self, r: int, step: Transition, now: float) -> list[Decision]:
        robot = self.robots[r]
        if robot.acted_in_estop:
            # A safe action the e-stop sent: not the policy's, not part of any logged
            # episode (the stop cut them); the next action is the policy's after release.
            return [self._act(r, step.next_obs, step.next_obs_stamp, now)]
        self.stats.add(step.reward, step.done, robot.envs)
        if isinstance(self.learner, BackgroundUpdate):
            return self._complete_beside_update(r, step, now, self.learner)
        if (self.phase is Phase.COLLECTING and self.learning and robot.acted_by_sampling
                and robot.policy_outputs is not None):
            mean, std = robot.policy_outputs
            stored = StepOfEnvs(step.obs, step.action, mean, std, step.reward, step.done)
            if self.lanes.record(robot.envs, stored, step.next_obs):
                if self.cfg.learn_while_acting:
                    return self._iteration_done(r, step, now)
                if self.cfg.update_trigger != "episode_end":
                    return [self._begin_update(now)]
                self.phase = Phase.EPISODE_END
                self._episode_end_pending[:] = True
                self._episode_end_deadline = now + self.cfg.episode_end_timeout
        # Not elif: an env whose episode ends on the step that fills the rollout has ended.
        if self.phase is Phase.EPISODE_END:
            self._episode_end_pending[robot.envs] &= step.done == 0
            if not self._episode_end_pending.any() or now > self._episode_end_deadline:
                return [self._begin_update(now)]
        return [self._act(r, step.next_obs, step.next_obs_stamp, now)]

    def _act(self, r: int, obs: np.ndarray, stamp: int, now: float) -> PublishAction:
        robot = self.robots[r]
        rejoined = robot.stalled and self.fleet
        if robot.stalled:
            robot.stalled = False
            if self.fleet:
                self.counters.add("robot_rejoins")
        robot.acted_stamp = stamp
        robot.acted_in_estop = self.estop
        if self.estop:
            # Paired like any step, so the environment's answer is not taken for the
            # policy's; never learned from.
            robot.acted_by_sampling = False
            command = robot.guard.hold()
            robot.source.action_sent(obs, self._in_policy_units(command), stamp, now)
            return PublishAction(r, command, estop=True, rejoined=rejoined)
        actions = self.agent.act(obs, deterministic=self.cfg.deterministic)
        robot.policy_outputs = acted_outputs(self.agent, len(actions))
        mapped = self.actions(actions)
        command, finite = robot.guard.command(mapped)
        restored = False
        if finite:
            actions = self._as_sent(actions, mapped, command)
        else:
            self.counters.add("nonfinite_actions")
            if not self._update_running:
                # A running update's result is checked when it lands (``_update_landed``).
                with model_lock(self.agent):
                    restored = not all_finite(self.agent.model.parameters())
                    if restored:
                        self.agent.model.update(self._good_parameters)
        robot.source.action_sent(obs, actions, stamp, now)
        # A mean action is no sample of the policy, nor is a safe action sent in its place:
        # PPO must not learn from their steps, even if deterministic mode is switched off
        # before the step completes.
        robot.acted_by_sampling = finite and not self.cfg.deterministic
        return PublishAction(r, command, not finite, restored, rejoined=rejoined)

    def _as_sent(
        self, actions: np.ndarray, mapped: np.ndarray, command: np.ndarray
    ) -> np.ndarray:
        """The policy actions stored for ``command`` (``as_sent``), counting a guarded one."""
        if (command != mapped).any():
            self.counters.add("guarded_actions")
        return as_sent(actions, mapped, command, self.actions.scale)

    def _in_policy_units(self, command: np.ndarray) -> np.ndarray:
        return in_policy_units(command, self.actions.scale)

    def _cut(self, robot: Robot) -> None:
        """The robot's step stream broke: its episodes are cut, its lanes free."""
        self.lanes.cut(robot.envs)
        self.stats.cut(robot.envs)

    def _stall(self, robot: Robot) -> None:
        self._cut(robot)
        if not robot.stalled:
            robot.stalled = True
            if self.fleet:
                self.counters.add("robot_stalls")

    # Updates.

    def _begin_update(self, now: float) -> BeginUpdate:
        self.phase = Phase.UPDATING
        self._update_began = now
        for robot in self.robots:
            robot.source.reset()
        return BeginUpdate()

    def update(self) -> dict[str, float]:
        """The PPO update on the collected rollout; its metrics."""
        metrics = self.agent.update(self.lanes.bootstrap_obs)
        self.lanes.clear()
        if self.learner is not None:
            # The learner thread keeps them (checked on its side): no wait for its lock here.
            self._good_parameters = self.agent.good_parameters
            self.updates_run += 1
            return metrics
        with model_lock(self.agent):
            parameters = self.agent.model.parameters()
            # Kept for a later non-finite action (MLX arrays are immutable: references).
            if all_finite(parameters):
                self._good_parameters = parameters
        self.updates_run += 1
        return metrics

    def after_update(self) -> list[Save]:
        """The saves this iteration calls for: ``best`` when the policy is the best so far
        (see ``BestPolicy``), ``interval`` when a checkpoint is due."""
        saves = []
        if self.best is not None and self.best.offer(self.agent, self.stats):
            saves.append(Save("best"))
        interval = self.cfg.checkpoint_interval
        if interval and self.agent.iteration % interval == 0:
            saves.append(Save("interval"))
        return saves

    def resume(self, now: float, steady: float) -> list[Decision]:
        """The simulators run again: act on each live robot's newest observation, or
        finish. A robot silent for ``step_timeout`` before the update stalls (its step,
        cut short by the update, could not time out: the rollout may fill faster)."""
        if self.cfg.max_iterations and self.agent.iteration >= self.cfg.max_iterations:
            self.phase = Phase.FINISHED
            return [Finished()]
        self.phase = Phase.COLLECTING
        decisions: list[Decision] = []
        for r, robot in enumerate(self.robots):
            robot.watchdog.observed(steady)
            # The robot held the safe action (or stood still) during the update.
            robot.guard.hold()
            if robot.latest_obs is None or robot.stalled:
                # A stalled robot rejoins on an observation of its own, not on a stale one.
                continue
            if self._update_began - robot.heard > self.cfg.step_timeout:
                self._stall(robot)
                decisions.append(StepDropped(r))
                continue
            decisions.append(self._act(r, *robot.latest_obs, now))
        return decisions

    # The emergency stop and live switches.

    def set_estop(self, engaged: bool) -> list[Decision]:
        """Engage (the safe action to every robot at once) or release the e-stop.

        Engaged, every observation gets the safe action and nothing is learned or logged:
        the rollout is cut as for a lost step, the outstanding steps are forgotten and the
        episodes in progress are not logged. Released, the policy blends in again from
        the safe action (``blend_in_steps``) on each robot's next observation.
        """
        if engaged == self.estop:
            return self._hold_all() if engaged else []
        self.estop = engaged
        self.stats.cut()
        if not engaged:
            for robot in self.robots:
                robot.guard.hold()
            return []
        self.counters.add("estops")
        for robot in self.robots:
            robot.source.reset()
        if self.phase is Phase.COLLECTING:
            # Not once the rollout is complete (waiting for episode ends, updating).
            self._cut_rollout()
        return self._hold_all()

    def _hold_all(self) -> list[Decision]:
        return [PublishAction(r, robot.guard.hold(), estop=True)
                for r, robot in enumerate(self.robots)]

    def close(self) -> None:
        """Stop the learner thread, if one runs (after it, the agent learns in phases)."""
        if self.learner is not None:
            self.learner.stop()

    def set_training(self, training: bool) -> None:
        if self.cfg.training and not training:
            self._cut_rollout()
        self.cfg.training = training

    def set_deterministic(self, deterministic: bool) -> None:
        # Mean actions are not samples of the policy: PPO must not learn from them.
        if deterministic and not self.cfg.deterministic:
            self._cut_rollout()
        self.cfg.deterministic = deterministic

    def _cut_rollout(self) -> None:
        """End the segments being collected: the next stored steps do not continue them."""
        for robot in self.robots:
            self.lanes.cut(robot.envs)
