"""The topic contract's step source: each published action paired with the reward, done
and next observation it caused (``StepSync``), from arrays that arrive on their own.

ROS-free: the trainer node feeds it validated arrays with their reception stamps
and the node clock's time, and acts on what it returns. The three parts of a step
may arrive in any order. Rules, each counted:

- an observation with no action outstanding starts a segment (act on it);
- a reward or done with no action outstanding, or received before the observation
  the outstanding action answers, is stale and dropped;
- a second part of the same kind for one step is a duplicate and dropped; so is an
  observation bit-identical to the one the action answers (an environment
  re-publishing its first observation before it saw the action);
- a step not complete within ``step_timeout`` of its action is dropped: the caller
  cuts the segment and the next observation starts a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from unilab_ros.loop.counters import Counters
from unilab_ros.loop.steps import Deadline, OneStepOutstanding, SegmentStart, Transition

STEP_COUNTERS = ("steps_completed", "steps_dropped", "stale_messages", "duplicate_messages")
"""The pairing's counters (also the diagnostics keys)."""


@dataclass
class _Pending:
    obs: np.ndarray
    action: np.ndarray
    obs_stamp: int
    deadline: Deadline
    reward: np.ndarray | None = None
    done: np.ndarray | None = None
    next_obs: np.ndarray | None = None
    next_obs_stamp: int = 0


@dataclass
class StepSync(OneStepOutstanding):
    """The step synchroniser; times are seconds on the node clock, stamps are ns."""

    step_timeout: float
    counters: Counters = field(default_factory=lambda: Counters(STEP_COUNTERS))
    _pending: _Pending | None = None

    @property
    def awaiting_step(self) -> bool:
        """An action is outstanding."""
        return self._pending is not None

    def reset(self) -> None:
        """Forget the outstanding step (e.g. around an update)."""
        self._pending = None

    def on_observation(self, obs: np.ndarray, stamp: int) -> SegmentStart | Transition | None:
        """An observation: a SegmentStart when no action is outstanding, the completed
        Transition when it finishes a step, else None."""
        pending = self._pending
        if pending is None:
            return SegmentStart(obs, stamp)
        if stamp < pending.obs_stamp:
            return self._count("stale_messages")
        if pending.next_obs is not None or np.array_equal(obs, pending.obs):
            return self._count("duplicate_messages")
        pending.next_obs, pending.next_obs_stamp = obs, stamp
        return self._complete()

    def on_reward(self, reward: np.ndarray, stamp: int) -> Transition | None:
        return self._fill("reward", reward, stamp)

    def on_done(self, done: np.ndarray, stamp: int) -> Transition | None:
        return self._fill("done", done, stamp)

    def _fill(self, part: str, value: np.ndarray, stamp: int) -> Transition | None:
        pending = self._pending
        if pending is None or stamp < pending.obs_stamp:
            return self._count("stale_messages")
        if getattr(pending, part) is not None:
            return self._count("duplicate_messages")
        setattr(pending, part, value)
        return self._complete()

    def action_sent(self, obs: np.ndarray, action: np.ndarray, obs_stamp: int, now: float) -> None:
        """Record the action published for ``obs``; its step must complete by now + timeout."""
        self._pending = _Pending(obs, action, obs_stamp, Deadline(now, self.step_timeout))

    def _complete(self) -> Transition | None:
        pending = self._pending
        if (
            pending is None
            or pending.reward is None
            or pending.done is None
            or pending.next_obs is None
        ):
            return None
        self._pending = None
        self.counters.add("steps_completed")
        return Transition(
            pending.obs,
            pending.action,
            pending.reward,
            pending.done,
            pending.next_obs,
            pending.next_obs_stamp,
        )

    def _count(self, counter: str) -> None:
        self.counters.add(counter)
        return None
