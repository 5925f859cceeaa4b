"""When a free-running simulation takes its next tick, and which streams are due (ROS-free).

``Pacer`` keeps sim time at ``real_time_factor`` x wall time from an anchor, so sleeping
too long once does not make the next ticks late: the pace is held on average, not tick by
tick. A simulation that falls further behind than ``max_lag`` (the machine cannot keep up,
or the process was stopped) is re-anchored instead of racing to catch up, and counted.
``Every`` marks the ticks at which a stream of a given rate (sim time) publishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    """Wall time to wait before each tick, for sim time = real_time_factor x wall time."""

    def __init__(self, real_time_factor: float, max_lag: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.real_time_factor = real_time_factor
        self.max_lag = max_lag
        self.late = 0
        """Times the simulation fell more than max_lag (wall s) behind and was re-anchored."""
        self._clock = clock
        self._wall = clock()
        self._sim = 0.0

    def anchor(self, sim_time: float) -> None:
        """Start pacing from now (at start and after a pause)."""
        self._wall = self._clock()
        self._sim = sim_time

    def delay(self, sim_time: float) -> float:
        """Wall seconds to wait until ``sim_time`` is due (0 when due or when unpaced)."""
        if self.real_time_factor <= 0.0:
            return 0.0
        due = self._wall + (sim_time - self._sim) / self.real_time_factor
        delay = due - self._clock()
        if delay < -self.max_lag:
            self.late += 1
            self.anchor(sim_time)
            return 0.0
        return max(delay, 0.0)


class Every:
    """Due at the first tick at or after each multiple of 1 / rate (sim nanoseconds)."""

    def __init__(self, rate: float, start_ns: int = 0) -> None:
        self.period_ns = max(1, round(1e9 / rate))
        self._next_ns = start_ns

    def due(self, time_ns: int) -> bool:
        if time_ns < self._next_ns:
            return False
        self._next_ns += self.period_ns
        if self._next_ns <= time_ns:
            # Ticks coarser than the period: the rate is the tick rate, not a burst.
            self._next_ns = time_ns + self.period_ns
        return True
