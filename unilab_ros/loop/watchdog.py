"""The observation watchdog of the trainer and of the policy node (ROS-free)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WatchdogConfig:
    """What a node does when observations stop."""

    obs_timeout: float = 1.0
    """Seconds (steady clock) without an observation before the watchdog acts."""
    watchdog_safe_action: bool = True
    """The watchdog publishes the safe action (else it only reports)."""

    def validate(self) -> None:
        if self.obs_timeout <= 0.0:
            raise ValueError("obs_timeout must be positive")


@dataclass(frozen=True)
class Silence:
    """Observations stopped: ``first`` on the check that found it, then on every check
    until one arrives; ``publish_safe`` tells whether the safe action goes out."""

    first: bool
    publish_safe: bool


class Watchdog:
    """Trips once per silence longer than ``obs_timeout``; times are steady-clock seconds."""

    def __init__(self, cfg: WatchdogConfig) -> None:
        self.cfg = cfg
        self.tripped = False
        self._last_obs: float | None = None

    @property
    def period(self) -> float:
        """How often to check: often enough that a silence is caught within ~half a timeout."""
        return min(0.1, self.cfg.obs_timeout / 2.0)

    def observed(self, now: float) -> None:
        """An observation arrived (or acting restarted): the silence, if any, ends."""
        self._last_obs = now
        self.tripped = False

    def reset(self) -> None:
        """Forget the last observation: the watchdog waits for a first one again."""
        self._last_obs = None
        self.tripped = False

    def check(self, now: float) -> Silence | None:
        """None while observations flow (or before the first one), else the silence."""
        if self._last_obs is None or now - self._last_obs <= self.cfg.obs_timeout:
            return None
        first = not self.tripped
        self.tripped = True
        return Silence(first, self.cfg.watchdog_safe_action)
