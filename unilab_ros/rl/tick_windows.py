"""When a learner beside a periodic control loop may compute (``learner_quiet_ms``).

On a computer with few cores a learner computing while a control tick is handled slows the
tick, whatever its CPU priority (measured on 2 cores: the learner process at SCHED_IDLE
added ~1.8 ms to the command period's p99 jitter; the trainer's own work for it, recording
and sending each step, nothing measurable). The control loop's steps reach the learner one
per tick, so their arrivals tell the period and the phase: ``TickWindows`` keeps the
learner quiet from ``quiet`` seconds before the next tick is due until ``quiet`` seconds
after its step arrived, and starts a gradient step only if it ends (by its running
duration) before the quiet time (one that cannot still starts in the first half of the
period: the learner is slowed, never starved). Steps that do not arrive periodically (a
fleet's robots, an event-driven source, a stopped robot) leave the learner unconstrained.
"""

from __future__ import annotations

import statistics
from collections import deque

PERIODS_KEPT = 50
"""Step arrival intervals the period is the median of."""
MIN_PERIODS = 10
"""Intervals needed before the learner is held to windows."""
REGULAR = 0.25
"""A loop is periodic when the middle half of its intervals lies within this fraction of
their median."""
STEP_TIME_RATE = 0.1
"""The weight of the newest gradient step's duration in its running estimate."""


class TickWindows:
    """The arrivals of the control loop's steps and the gradient steps' duration; ``wait``
    says how long the learner should wait before its next gradient step."""

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self.step_time = 0.0
        self._last: float | None = None
        self._intervals: deque[float] = deque(maxlen=PERIODS_KEPT)

    def arrived(self, now: float) -> None:
        """A step of the control loop arrived at ``now``."""
        if self._last is not None:
            self._intervals.append(now - self._last)
        self._last = now

    def stepped(self, seconds: float) -> None:
        """A gradient step took ``seconds``."""
        self.step_time += STEP_TIME_RATE * (seconds - self.step_time) if self.step_time \
            else seconds

    @property
    def period(self) -> float | None:
        """The control period, when the steps arrive periodically."""
        if self.quiet <= 0.0 or len(self._intervals) < MIN_PERIODS:
            return None
        ordered = sorted(self._intervals)
        median = statistics.median(ordered)
        quarter = len(ordered) // 4
        if median <= 0.0 or (ordered[-1 - quarter] - ordered[quarter]) > REGULAR * median:
            return None
        return median

    def wait(self, now: float) -> float:
        """Seconds to wait before the next gradient step (0: now). A step arriving meanwhile
        ends the wait early (the caller polls its inbox for this long)."""
        period = self.period
        if period is None or self._last is None:
            return 0.0
        since = now - self._last
        if since > 2.0 * period:
            return 0.0  # the loop stopped stepping (a reset, a pause): no tick to keep clear
        opens = self.quiet
        # A gradient step longer than the window still starts once per tick, at its start.
        closes = max(period - self.quiet - self.step_time, 0.5 * period)
        if opens <= since <= closes:
            return 0.0
        if since < opens:
            return opens - since
        # Too close to the next tick: its step ends the wait; if it is late, the window
        # after it would have opened by then.
        return period + opens - since
