"""The clocked step source of one robot that speaks standard messages (ROS-free).

The ROS side decodes each message into a sample and hands it to ``on_sample``; a timer at
the spec's control rate on the node clock (sim time under use_sim_time) calls ``tick``,
which acts on the newest sample of every source:

- a source not heard from since the episode started makes the tick return None and is
  named in ``waiting`` (counted): the caller holds the safe action;
- a source older than its ``max_age`` (header stamp, else arrival time) makes the tick
  return None and fills ``stale`` (source -> age, each counted): the caller sends the safe
  action. An outstanding step is cut (dropped, counted; ``expired`` reports it once, so the
  training loop cuts the segment as a time-out) and the episode ends;
- otherwise the tick returns the ``Transition`` of the outstanding action (its reward, its
  done code and the next observation), or, with no action outstanding, a ``SegmentStart``
  to act on;
- a step that took longer than ``step_deadline`` in the robot's time (its data's newest
  stamp: a loop that cannot keep up with the robot misses ticks, and its node clock may lag
  the robot's) is not learned from: dropped (counted in ``late_steps``), its segment cut as
  a time-out (``cut_pending`` until ``expired`` reports it), and the tick acts on the new
  observation as a ``SegmentStart``. ``rate`` measures the acting ticks per second of robot
  time; ``shortfall`` holds a window below 90 % of the spec's rate (counted).

After a done (a Transition whose done is not 0, or a stale cut) ``needs_reset`` is True and
ticks return None. The caller then sends the safe action (at once on a failure: a real
robot cannot be paused), runs the updates that wait for an episode end, calls the spec's
reset service (``reset.mode`` service) or waits for the operator's ``~/ready`` (operator),
and calls ``start_episode(now)`` once that completed; ticks act again when every source
has a sample newer than that time (fresh data: no observation mixes the old episode with
the new one). Arrays have one row (one env); stamps are the tick time in ns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from unilab_ros.loop.counters import Counters
from unilab_ros.loop.steps import Deadline, OneStepOutstanding, SegmentStart, Transition
from unilab_ros.rl.done_codes import DoneCode
from unilab_ros.robot.commands import draw_commands, read_commands
from unilab_ros.robot.control_rate import ControlRate, RateShortfall
from unilab_ros.robot.extract import joint_indices
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.samples import SAMPLE_TYPES, JointStateSample, Sample
from unilab_ros.robot.spec import RobotSpec
from unilab_ros.robot.task import Task
from unilab_ros.robot.terms import TermContext

STEP_DEADLINE_PERIODS = 3
"""Control periods an action may stay unanswered before ``expired`` drops its step (ticks
stopped: the caller's timer or clock stalled), unless ``step_timeout`` allows longer."""


@dataclass
class _Pending:
    obs: np.ndarray
    action: np.ndarray
    deadline: Deadline
    robot_time: float
    """The robot's time (its data's newest stamp) when the action went out."""


class RobotSteps(OneStepOutstanding):
    """The step source of one robot; times are seconds on the node clock."""

    def __init__(self, spec: RobotSpec, rng: np.random.Generator,
                 step_timeout: float = 0.0) -> None:
        """``step_timeout``: seconds an action may stay unanswered (at least
        ``STEP_DEADLINE_PERIODS`` periods): on a loaded host a tick can come late."""
        self.spec = spec
        self.step_deadline = max(STEP_DEADLINE_PERIODS * spec.dt, step_timeout)
        self.rng = rng
        self.observation = ObservationBuilder(spec)
        self.task = Task(spec)
        self.counters = Counters(
            ["steps_completed", "steps_dropped", "stale_ticks", "stale_cuts", "waiting_ticks",
             "episodes", "failures", "time_outs", "late_steps", "rate_shortfalls",
             "rejected_messages"] + [f"stale_{s.name}" for s in spec.sources])
        self.stale: dict[str, float] = {}
        """The sources the latest tick found too old, with their ages (s); empty if fresh."""
        self.waiting: list[str] = []
        """The sources the latest tick still waited for: none heard since the episode
        started (after a reset, or ever)."""
        self.needs_reset = False
        """An episode ended: reset the robot, then ``start_episode``."""
        self.episode_step = 0
        """Steps completed in the episode."""
        self.commands: dict[str, np.ndarray] = {}
        """The episode's sampled commands and targets."""
        self.reward_shares: list[float] = []
        """The latest step's reward per term (weight x value x dt), in spec order."""
        self.fired: list[str] = []
        """The kinds of the terminations that ended the latest step (empty: it ran on)."""
        self.rate = ControlRate(spec.dt)
        """The acting ticks per second of robot time."""
        self.shortfall: RateShortfall | None = None
        """The window the latest tick closed below the threshold rate (None: none)."""
        self._joints = _joints_by_source(spec)
        self._checked_names: dict[str, tuple[str, ...]] = {}
        self._newest: dict[str, tuple[Sample, float]] = {}
        self._previous: dict[str, Sample] = {}
        self._pending: _Pending | None = None
        self._cut = False
        self.start_episode(-math.inf)

    def term_values(self) -> dict[str, float]:
        """The latest step's value of each weighted reward term (its share / (weight x
        dt)), keyed ``index:kind``: the distance left at an episode's end, say."""
        return {f"{i}:{term.kind}": round(share / (term.weight * self.spec.dt), 6)
                for i, (term, share) in enumerate(zip(self.spec.rewards, self.reward_shares,
                                                      strict=True)) if term.weight}

    def start_episode(self, now: float) -> None:
        """A new episode from ``now`` (the robot was reset): new commands, empty history; the
        first tick acts on samples newer than ``now``."""
        self._fresh_after = now
        self.needs_reset = False
        self.episode_step = 0
        self.observation.reset()
        self._previous = {}
        self._pending = None
        n = len(self.spec.actions.joints)
        self._action, self._previous_action = np.zeros(n), np.zeros(n)
        self.commands = draw_commands(self.spec, self.rng)

    def on_sample(self, source: str, sample: Sample, now: float) -> None:
        """Keep the newest sample of ``source``; an unknown source, a sample of the wrong
        type or a joint state without a joint the spec names is an error."""
        spec_source = next((s for s in self.spec.sources if s.name == source), None)
        if spec_source is None:
            raise ValueError(f"no source named {source!r} in spec {self.spec.name!r}")
        expected = SAMPLE_TYPES[spec_source.type]
        if not isinstance(sample, expected):
            raise ValueError(f"source {source!r} ({spec_source.type}) takes a "
                             f"{expected.__name__}, got {type(sample).__name__}")
        if isinstance(sample, JointStateSample) and self._checked_names.get(source) != \
                sample.names:
            joint_indices(sample.names, self._joints.get(source, ()))
            self._checked_names[source] = sample.names
        self._newest[source] = (sample, now if sample.stamp is None else sample.stamp)

    @property
    def newest(self) -> dict[str, Sample]:
        """The newest sample of every source heard from."""
        return {name: sample for name, (sample, _) in self._newest.items()}

    def ages(self, now: float) -> dict[str, float]:
        """Seconds since each source's newest sample (inf: none yet), for ``~/status``."""
        return {s.name: now - self._newest[s.name][1] if s.name in self._newest else math.inf
                for s in self.spec.sources}

    @property
    def robot_time(self) -> float:
        """The robot's time: the newest stamp (arrival time when unstamped) of its data."""
        return max((when for _, when in self._newest.values()), default=-math.inf)

    @property
    def cut_pending(self) -> bool:
        """A step was cut (stale data, or late) and ``expired`` has not reported it yet."""
        return self._cut

    def tick(self, now: float) -> SegmentStart | Transition | None:
        """One control tick: see the module docstring."""
        self.shortfall = None
        event = self._tick(now)
        if event is None:
            self.rate.restart()
            return None
        self.shortfall = self.rate.tick(self.robot_time)
        if self.shortfall is not None:
            self.counters.add("rate_shortfalls")
        return event

    def _tick(self, now: float) -> SegmentStart | Transition | None:
        if self.needs_reset:
            return None
        # A clock that went back (sim time restarted) leaves nothing newer than the reset.
        self._fresh_after = min(self._fresh_after, now)
        self.waiting = [s.name for s in self.spec.sources if s.name not in self._newest
                        or self._newest[s.name][1] < self._fresh_after]
        if self.waiting:
            self.stale = {}
            self.counters.add("waiting_ticks")
            return None
        ages = self.ages(now)
        self.stale = {s.name: ages[s.name] for s in self.spec.sources
                      if ages[s.name] > s.max_age}
        if self.stale:
            self._on_stale()
            return None
        samples = self.newest
        stamp = round(now * 1e9)
        pending = self._pending
        if pending is not None:
            self.episode_step += 1
        ctx = TermContext(samples=samples, previous=self._previous,
                          commands={**self.commands, **read_commands(self.spec, samples)},
                          default_pose=self.spec.default_pose, action=self._action,
                          previous_action=self._previous_action, dt=self.spec.dt,
                          episode_step=self.episode_step)
        self._previous = samples
        obs = self.observation.build_from(ctx)[None, :]
        if pending is None:
            return SegmentStart(obs, stamp)
        self._pending = None
        code, self.fired = self.task.done(ctx)
        reward, self.reward_shares = self.task.reward(ctx, code)
        late = self.robot_time - pending.robot_time > self.step_deadline
        if late:
            self.counters.add("steps_dropped")
            self.counters.add("late_steps")
            self._cut = True
        else:
            self.counters.add("steps_completed")
        if code != DoneCode.RUNNING:
            self._end_episode("failures" if code == DoneCode.TERMINATED else "time_outs")
            if late:
                return None
        if late:
            # The policy's action was held far longer than a control period: no step of
            # the task. The robot goes on from here, a new segment.
            return SegmentStart(obs, stamp)
        return Transition(pending.obs, pending.action, np.array([reward], np.float32),
                          np.array([code], np.uint8), obs, stamp)

    def _on_stale(self) -> None:
        self.counters.add("stale_ticks")
        for name in self.stale:
            self.counters.add(f"stale_{name}")
        if self._pending is not None:
            self._pending = None
            self._cut = True
            self.counters.add("steps_dropped")
            self.counters.add("stale_cuts")
            # The safe action moved the robot off the policy's course: the episode is over.
            self._end_episode("time_outs")

    def _end_episode(self, counter: str) -> None:
        self.needs_reset = True
        self.counters.add("episodes")
        self.counters.add(counter)

    def action_sent(self, obs: np.ndarray, action: np.ndarray, obs_stamp: int,
                    now: float) -> None:
        """The loop acted on ``obs`` with ``action`` (policy units): the next fresh tick
        completes the step. After a done nothing is outstanding (the caller sends the safe
        action instead, and the next episode starts a segment of its own)."""
        if self.needs_reset:
            return
        self._pending = _Pending(obs, action, Deadline(now, self.step_deadline),
                                 self.robot_time)
        self._previous_action = self._action
        self._action = np.asarray(action, np.float64).reshape(-1)

    def expired(self, now: float) -> bool:
        """True once for a step a stale tick cut, or when the outstanding step passed its
        deadline (then dropped, counted)."""
        if self._cut:
            self._cut = False
            return True
        return super().expired(now)

    def reset(self) -> None:
        """Forget the outstanding step (around an update, on an e-stop)."""
        self._pending = None
        self._cut = False


def _joints_by_source(spec: RobotSpec) -> dict[str, list[str]]:
    """Every joint name the spec reads from each joint_state source; the commanded joints
    count for the first one (a controller's joints are broadcast)."""
    joints = {s.name: [] for s in spec.sources if s.type == "joint_state"}
    if joints:
        joints[next(iter(joints))] += spec.actions.joints
    for term in (*spec.observation, *spec.rewards, *spec.terminations):
        if term.source in joints:
            joints[term.source] += term.params.get("joints", ())
    return {name: list(dict.fromkeys(names)) for name, names in joints.items()}
