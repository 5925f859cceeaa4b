"""The control rate a robot's loop achieves, measured in the robot's time (ROS-free).

A trainer that cannot keep up with a fast robot (a simulator at a high real-time factor on
a busy host) misses control ticks: its node clock's timer skips the periods it was too late
for, and its node clock itself can lag the robot's, so neither shows the shortfall. The
robot's own time does: the newest header stamp of its data (the arrival time for unstamped
sources). ``ControlRate`` counts the acting ticks over windows of that time (the time
between consecutive acting ticks; resets and updates left out) and reports a window whose
rate falls below ``threshold`` of the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_WINDOW_S = 5.0
"""Seconds of robot time one measurement spans."""
RATE_THRESHOLD = 0.9
"""The share of the spec's control rate below which a window is a shortfall."""


@dataclass(frozen=True)
class RateShortfall:
    """A window whose achieved rate fell below the threshold."""

    achieved_hz: float
    expected_hz: float
    window_s: float


class ControlRate:
    """Acting ticks per second of robot time, over windows of ``window_s``."""

    def __init__(self, period: float, window_s: float = RATE_WINDOW_S,
                 threshold: float = RATE_THRESHOLD) -> None:
        self.expected_hz = 1.0 / period
        self.window_s = window_s
        self.threshold = threshold
        self.achieved_hz: float | None = None
        """The rate of the latest complete window (None before one)."""
        self._last: float | None = None
        self._span = 0.0
        """Seconds of robot time between acting ticks in the window, pauses left out."""
        self._ticks = 0

    def restart(self) -> None:
        """The loop stopped acting (waiting, stale data, a reset, an update): the time until
        the next acting tick is no control time, so a pause is no shortfall. The window
        goes on across it (episodes may be shorter than a window)."""
        self._last = None

    def tick(self, robot_time: float) -> RateShortfall | None:
        """An acting tick at ``robot_time`` (s); the shortfall when it closed a window whose
        rate was below the threshold."""
        last, self._last = self._last, robot_time
        if last is None or not 0.0 <= robot_time - last <= self.window_s:
            # After a pause, a clock that went back, or a gap longer than a window (an
            # update of a robot that was not paused): control time resumes here.
            return None
        self._span += robot_time - last
        self._ticks += 1
        if self._span < self.window_s:
            return None
        self.achieved_hz = self._ticks / self._span
        span, self._span, self._ticks = self._span, 0.0, 0
        if self.achieved_hz >= self.threshold * self.expected_hz:
            return None
        return RateShortfall(self.achieved_hz, self.expected_hz, span)

    def summary(self) -> dict[str, float | None]:
        """The achieved and expected rates (Hz) and the window, for ``~/status``."""
        achieved = None if self.achieved_hz is None else round(self.achieved_hz, 2)
        return {"achieved_hz": achieved, "expected_hz": round(self.expected_hz, 2),
                "window_s": self.window_s, "threshold": self.threshold}
