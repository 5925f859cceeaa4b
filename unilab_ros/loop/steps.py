"""The step sources' vocabulary, shared by the training loop and the robot spec (ROS-free).

A step source tells the training loop when a robot's step started (``SegmentStart``: act
on this observation) and when it completed (``Transition``); ``StepSource`` is what the
loop asks of one. Each source keeps at most one step outstanding until its ``Deadline``
(``OneStepOutstanding``). The sources: ``step_sync.StepSync`` (the topic contract's arrays)
and ``robot.steps.RobotSteps`` (a robot spec's clocked ticks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from unilab_ros.loop.counters import Counters


class StepSource(Protocol):
    """What the training loop needs of a robot's step source besides its events."""

    counters: Counters

    def action_sent(self, obs: np.ndarray, action: np.ndarray, obs_stamp: int,
                    now: float) -> None:
        """The loop acted on ``obs``: a step is outstanding until its deadline."""

    def expired(self, now: float) -> bool:
        """Drop the outstanding step if it is late; True when one was dropped."""

    def drop(self) -> bool:
        """Drop the outstanding step (counted), if any; True when one was dropped."""

    def reset(self) -> None:
        """Forget the outstanding step (around an update, on an e-stop)."""


@dataclass(frozen=True)
class SegmentStart:
    """An observation with no action outstanding: act on it."""

    obs: np.ndarray
    stamp: int


@dataclass(frozen=True)
class Transition:
    """One completed step of every env."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    next_obs: np.ndarray
    next_obs_stamp: int
    """Reception stamp of ``next_obs`` (the next action answers it)."""


class Deadline:
    """When an outstanding step is late: ``timeout`` seconds after its action, on a clock
    that may go back (sim time restarted, a replayed /clock). A clock earlier than the
    action moves the deadline to ``timeout`` from then: measured on the old time line it
    would lie as far away as the clock jumped."""

    def __init__(self, now: float, timeout: float) -> None:
        self.timeout = timeout
        self.at = now + timeout

    def passed(self, now: float) -> bool:
        if now < self.at - self.timeout:
            self.at = now + self.timeout
        return now > self.at


class OneStepOutstanding:
    """What every step source does with its one outstanding step (``_pending``, anything
    with a ``deadline``): drop it, counted, when it is late or when asked."""

    counters: Counters
    _pending: Any

    def expired(self, now: float) -> bool:
        """Drop the outstanding step if its deadline passed (see ``Deadline``); True when
        one was dropped."""
        if self._pending is None or not self._pending.deadline.passed(now):
            return False
        return self.drop()

    def drop(self) -> bool:
        """Drop the outstanding step (counted), if any; True when one was dropped."""
        if self._pending is None:
            return False
        self._pending = None
        self.counters.add("steps_dropped")
        return True
