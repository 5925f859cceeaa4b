"""The trainer's collect/update state machine, ROS-free: arrays and times in, decisions out.

``TrainingLoop`` owns what the trainer decides: pairing the parts of a step
(``StepSync``), episode statistics, the agent, whether a step is learned from, the
episode-end wait, the observation the update bootstraps from, when to update and save,
and the watchdog's consequences. Its caller (the trainer node, or the in-process demo)
converts messages, keeps the clocks and carries out what the returned decisions say.
Times: ``now`` is the node clock (sim time under use_sim_time) in seconds, ``steady`` a
steady clock in seconds, ``stamp`` a message's reception time in ns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from unilab_ros.action_safety import ActionGuard, ActionSafetyConfig
from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.checkpoint import all_finite
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.stepper import SegmentStart, StepSync, Transition
from unilab_ros.watchdog import Silence, Watchdog, WatchdogConfig

if TYPE_CHECKING:
    from unilab_ros.fleet_loop import RobotStalled

UPDATE_TRIGGERS = ("rollout_full", "episode_end")
COUNTERS = (
    "rejected_observations",
    "rejected_rewards",
    "rejected_dones",
    "discarded_during_update",
    "watchdog_trips",
    "safe_actions_published",
    "nonfinite_actions",
    "save_failures",
    "save_requests_refused",
    "estops",
    "guarded_actions",
)
"""The trainer's counters besides the synchroniser's, in their reporting order."""


@dataclass
class LoopConfig:
    """When the trainer stores, updates and stops."""

    step_timeout: float = 1.0
    """Seconds (node clock: sim time under use_sim_time) for reward, done and next
    observation to follow an action; a late step is dropped and cuts the segment."""
    update_trigger: str = "rollout_full"
    """rollout_full: update as soon as the rollout is full; episode_end: then keep
    acting without storing until every env's episode ends, and update while it resets."""
    episode_end_timeout: float = 30.0
    """Seconds (node clock) episode_end waits for the episodes to end before updating."""
    checkpoint_interval: int = 50
    """Save a checkpoint every this many iterations (and always on shutdown); 0: only then."""
    max_iterations: int = 0
    """Stop (and save) after this many iterations in total; 0 trains until stopped."""
    training: bool = True
    """Learn from the steps (else only act); see the ~/set_training service."""
    deterministic: bool = False
    """Act with the mean action (no learning from those steps); see ~/set_deterministic."""

    def validate(self) -> None:
        if self.step_timeout <= 0.0 or self.episode_end_timeout <= 0.0:
            raise ValueError("step_timeout and episode_end_timeout must be positive")
        if self.update_trigger not in UPDATE_TRIGGERS:
            raise ValueError(f"update_trigger must be one of {UPDATE_TRIGGERS}")
        if self.checkpoint_interval < 0 or self.max_iterations < 0:
            raise ValueError("checkpoint_interval and max_iterations must be >= 0")


class Phase(str, Enum):
    WAITING = "waiting_for_observation"
    COLLECTING = "collecting"
    EPISODE_END = "waiting_for_episode_end"
    UPDATING = "updating"
    FINISHED = "finished"


@dataclass(frozen=True)
class PublishAction:
    """Publish ``command`` (mapped and clipped, ready for the robot)."""

    command: np.ndarray
    nonfinite: bool = False
    """The policy gave NaN or Inf: ``command`` is the safe action instead."""
    restored: bool = False
    """... and the model was non-finite: the last finite parameters are back."""
    estop: bool = False
    """The e-stop is engaged: ``command`` is the safe action."""


@dataclass(frozen=True)
class BeginUpdate:
    """The rollout is complete: pause the simulator, then call ``update``."""


@dataclass(frozen=True)
class StepDropped:
    """A step missed ``step_timeout`` and the segment is cut; ``then`` acts on a newer
    observation the environment waits at, if there is one."""

    then: PublishAction | None


@dataclass(frozen=True)
class Save:
    """Write a checkpoint, for ``reason``."""

    reason: str


@dataclass(frozen=True)
class Finished:
    """``max_iterations`` reached: save and stop acting."""


Decision = PublishAction | BeginUpdate | None


class LoopBase(ABC):
    """What the single-robot loop and the fleet's share: counters, the update's
    bookkeeping, the end of the run and the live switches. A subclass says how its
    rollout is cut (``_cut_rollout``)."""

    def __init__(
        self,
        cfg: LoopConfig,
        agent: PPOAgent,
        actions: ActionMapper,
        stats: EpisodeStats | None,
        best: BestPolicy | None,
        counters: tuple[str, ...] = COUNTERS,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.agent = agent
        self.actions = actions
        self.stats = stats or EpisodeStats(agent.cfg.num_envs)
        self.best = best
        self.counters = dict.fromkeys(counters, 0)
        self.estop = False
        self.phase = Phase.WAITING
        self.updates_run = 0
        self._good_parameters = agent.model.parameters()

    def count(self, counter: str) -> int:
        """Add one to ``counter`` (one of ``COUNTERS``); returns its new value."""
        self.counters[counter] += 1
        return self.counters[counter]

    @property
    def learning(self) -> bool:
        return self.cfg.training and not self.cfg.deterministic

    def _in_policy_units(self, command: np.ndarray) -> np.ndarray:
        """``command`` before ``action_scale`` (0 where a dim's scale is 0: any action
        maps to the same command there)."""
        scale = self.actions.scale
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(scale != 0.0, command / scale, 0.0).astype(np.float32)

    def _update_from(self, bootstrap_obs: np.ndarray) -> dict[str, float]:
        """The PPO update on the collected rollout; its metrics."""
        metrics = self.agent.update(bootstrap_obs)
        parameters = self.agent.model.parameters()
        # Kept for a later non-finite action (MLX arrays are immutable: references).
        if all_finite(parameters):
            self._good_parameters = parameters
        self.updates_run += 1
        return metrics

    def after_update(self) -> Save | None:
        """Offer the policy to ``best``; the checkpoint this iteration is due, if any."""
        if self.best is not None:
            self.best.offer(self.agent, self.stats)
        interval = self.cfg.checkpoint_interval
        if interval and self.agent.iteration % interval == 0:
            return Save("interval")
        return None

    def _finished(self) -> bool:
        """Whether ``max_iterations`` is reached (the phase then says so)."""
        if self.cfg.max_iterations and self.agent.iteration >= self.cfg.max_iterations:
            self.phase = Phase.FINISHED
            return True
        return False

    # Live switches.

    def set_training(self, training: bool) -> None:
        if self.cfg.training and not training:
            self._cut_rollout()
        self.cfg.training = training

    def set_deterministic(self, deterministic: bool) -> None:
        # Mean actions are not samples of the policy: PPO must not learn from them.
        if deterministic and not self.cfg.deterministic:
            self._cut_rollout()
        self.cfg.deterministic = deterministic

    def set_learning_rate(self, rate: float) -> None:
        # The adaptive schedule goes on from this rate.
        self.agent.trainer.learning_rate = rate
        self.agent.ppo_cfg.learning_rate = rate

    def simulators_to_pause(self) -> list[int]:
        """The robots whose simulators are paused around an update: here the one robot."""
        return [0]

    def pause_unanswered(self, r: int) -> RobotStalled | None:
        """Robot ``r``'s simulator did not answer its pause. A single robot has no others
        to go on with: nothing changes (the fleet stalls the robot)."""
        return None

    @abstractmethod
    def _cut_rollout(self) -> None:
        """End the rollout segment being collected: the next stored step does not continue it."""


class TrainingLoop(LoopBase):
    """The trainer's decisions over one training session; see the module docstring."""

    def __init__(
        self,
        cfg: LoopConfig,
        agent: PPOAgent,
        actions: ActionMapper,
        stats: EpisodeStats | None = None,
        best: BestPolicy | None = None,
        watchdog: WatchdogConfig | None = None,
        safety: ActionSafetyConfig | None = None,
    ) -> None:
        super().__init__(cfg, agent, actions, stats, best)
        self.watchdog = Watchdog(watchdog or WatchdogConfig())
        self.sync = StepSync(cfg.step_timeout)
        self.guard = ActionGuard(safety or ActionSafetyConfig(), actions.safe)
        # The robot stood at the safe action before the first command: blend in from it.
        self.guard.hold()
        self._acted_in_estop = False
        self._latest_obs: tuple[np.ndarray, int] | None = None
        self._acted_stamp = 0
        """Reception stamp of the observation the latest action answered."""
        self._acted_by_sampling = False
        self._bootstrap_obs: np.ndarray | None = None
        self._episode_end_pending = np.zeros(agent.cfg.num_envs, bool)
        self._episode_end_deadline = 0.0

    @property
    def step_counters(self) -> dict[str, int]:
        """The synchroniser's counters."""
        return self.sync.counters

    # Steps.

    def on_observation(self, obs: np.ndarray, stamp: int, now: float, steady: float) -> Decision:
        """A valid observation."""
        self._latest_obs = (obs, stamp)
        self.watchdog.observed(steady)
        if self.phase is Phase.WAITING:
            self.phase = Phase.COLLECTING
        if not self._collecting():
            return None
        match self.sync.on_observation(obs, stamp):
            case SegmentStart(obs=start, stamp=start_stamp):
                return self._act(start, start_stamp, now)
            case Transition() as step:
                return self._complete(step, now)
        return None

    def on_reward(self, reward: np.ndarray, stamp: int, now: float) -> Decision:
        """A valid reward."""
        if not self._collecting():
            return None
        return self._complete(self.sync.on_reward(reward, stamp), now)

    def on_done(self, done: np.ndarray, stamp: int, now: float) -> Decision:
        """A valid done-code vector."""
        if not self._collecting():
            return None
        return self._complete(self.sync.on_done(done, stamp), now)

    def _collecting(self) -> bool:
        """True while steps are taken; a valid message that arrives during an update
        (e.g. while the simulator's pause is awaited) is counted as discarded."""
        if self.phase is Phase.UPDATING:
            self.count("discarded_during_update")
        return self.phase in (Phase.COLLECTING, Phase.EPISODE_END)

    def _complete(self, step: Transition | None, now: float) -> Decision:
        if step is None:
            return None
        if self._acted_in_estop:
            # A safe action the e-stop sent: not the policy's, not part of any logged
            # episode (the stop cut them); the next action is the policy's after release.
            return self._act(step.next_obs, step.next_obs_stamp, now)
        self.stats.add(step.reward, step.done)
        if self.phase is Phase.COLLECTING and self.learning and self._acted_by_sampling:
            if self.agent.record(step.obs, step.action, step.reward, step.done):
                self._bootstrap_obs = step.next_obs
                if self.cfg.update_trigger != "episode_end":
                    return self._begin_update()
                self.phase = Phase.EPISODE_END
                self._episode_end_pending[:] = True
                self._episode_end_deadline = now + self.cfg.episode_end_timeout
        # Not elif: an env whose episode ends on the step that fills the rollout has ended.
        if self.phase is Phase.EPISODE_END:
            self._episode_end_pending &= step.done == 0
            if not self._episode_end_pending.any() or now > self._episode_end_deadline:
                return self._begin_update()
        return self._act(step.next_obs, step.next_obs_stamp, now)

    def _act(self, obs: np.ndarray, stamp: int, now: float) -> PublishAction:
        self._acted_stamp = stamp
        self._acted_in_estop = self.estop
        if self.estop:
            # Paired like any step, so the environment's answer is not taken for the
            # policy's; never learned from.
            self._acted_by_sampling = False
            command = self.guard.hold()
            self.sync.action_sent(obs, self._in_policy_units(command), stamp, now)
            return PublishAction(command, estop=True)
        actions = self.agent.act(obs, deterministic=self.cfg.deterministic)
        mapped = self.actions(actions)
        finite = bool(np.isfinite(mapped).all())
        restored = False
        if finite:
            command = self.guard(mapped)
            actions = self._as_sent(actions, mapped, command)
        else:
            # Whatever the model holds, no NaN or Inf reaches the robot.
            command = self.guard.hold()
            self.count("nonfinite_actions")
            restored = not all_finite(self.agent.model.parameters())
            if restored:
                self.agent.model.update(self._good_parameters)
        self.sync.action_sent(obs, actions, stamp, now)
        # A mean action is no sample of the policy, nor is a safe action sent in its place:
        # PPO must not learn from their steps, even if deterministic mode is switched off
        # before the step completes.
        self._acted_by_sampling = finite and not self.cfg.deterministic
        return PublishAction(command, not finite, restored)

    def _as_sent(
        self, actions: np.ndarray, mapped: np.ndarray, command: np.ndarray
    ) -> np.ndarray:
        """The policy actions PPO stores for ``command``: where the guard (blend-in,
        smoothing, rate limit) changed the mapped action, what was sent, in policy units,
        with the acting policy's log-prob of it; elsewhere the policy's own action
        (unclipped, as the bounds loss expects)."""
        changed = command != mapped
        if not changed.any():
            return actions
        self.count("guarded_actions")
        sent = np.where(changed, self._in_policy_units(command), actions).astype(np.float32)
        self.agent.sent_instead(sent)
        return sent

    def _cut_segment(self) -> None:
        """The step stream broke: no return is computed across the gap."""
        self.agent.cut()
        self.stats.cut()

    def check_step_deadline(self, now: float) -> StepDropped | None:
        """Drop the outstanding step if it is late."""
        if not self.sync.expired(now):
            return None
        self._cut_segment()
        # The environment waits for an action at the state it published last: when
        # that came after the dropped step's observation, act on it now rather than
        # leave the robot to the watchdog (or stalled, with watchdog_safe_action off).
        latest = self._latest_obs
        if latest is not None and latest[1] > self._acted_stamp:
            return StepDropped(self._act(*latest, now))
        return StepDropped(None)

    def check_watchdog(self, steady: float) -> Silence | None:
        """The silence while collecting, if observations stopped; its first check drops
        the outstanding step and cuts the segment."""
        if self.phase not in (Phase.COLLECTING, Phase.EPISODE_END):
            return None
        silence = self.watchdog.check(steady)
        if silence is not None and silence.publish_safe:
            self.guard.hold()
        if silence is not None and silence.first:
            self.count("watchdog_trips")
            if self.sync.drop():
                self._cut_segment()
        return silence

    # Updates.

    def _begin_update(self) -> BeginUpdate:
        self.phase = Phase.UPDATING
        self.sync.reset()
        return BeginUpdate()

    def update(self) -> dict[str, float]:
        """The PPO update on the collected rollout; its metrics."""
        assert self._bootstrap_obs is not None
        return self._update_from(self._bootstrap_obs)

    def resume(self, now: float, steady: float) -> PublishAction | Finished | None:
        """The simulator runs again: act on the newest observation, or finish."""
        if self._finished():
            return Finished()
        self.phase = Phase.COLLECTING
        self.watchdog.observed(steady)
        # The robot held the safe action (or stood still) during the update.
        self.guard.hold()
        return self._act(*self._latest_obs, now) if self._latest_obs is not None else None

    # The emergency stop.

    def set_estop(self, engaged: bool) -> PublishAction | None:
        """Engage (the safe action to send at once) or release the e-stop.

        Engaged, every observation gets the safe action and nothing is learned or logged:
        the rollout is cut as for a lost step, the outstanding step is forgotten and the
        episodes in progress are not logged. Released, the policy blends in again from
        the safe action (``blend_in_steps``) on the next observation.
        """
        if engaged == self.estop:
            return PublishAction(self.guard.hold(), estop=True) if engaged else None
        self.estop = engaged
        self.stats.cut()
        if not engaged:
            self.guard.hold()
            return None
        self.count("estops")
        if self.phase is Phase.COLLECTING:
            # Not once the rollout is complete (waiting for episode ends, updating).
            self.agent.cut()
        self.sync.reset()
        return PublishAction(self.guard.hold(), estop=True)

    def _cut_rollout(self) -> None:
        self.agent.cut()
