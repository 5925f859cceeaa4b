"""Episode return and length statistics from per-step rewards and done codes."""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeStats:
    """Accumulates returns per env; keeps the last ``window`` finished episodes."""

    def __init__(self, num_envs: int, window: int = 100) -> None:
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self._whole = np.ones(num_envs, bool)
        self.finished_returns: deque[float] = deque(maxlen=window)
        self.finished_lengths: deque[int] = deque(maxlen=window)
        self.episodes = 0

    def add(
        self, rewards: np.ndarray, dones: np.ndarray, envs: np.ndarray | None = None
    ) -> None:
        """One step of every env, or of the envs ``envs`` (a fleet's robot)."""
        if envs is None:
            self._returns += rewards
            self._lengths += 1
            ended = np.flatnonzero(dones)
        else:
            self._returns[envs] += rewards
            self._lengths[envs] += 1
            ended = envs[np.flatnonzero(dones)]
        # An episode that lost steps to a cut would log a partial (flattering) return.
        whole = ended[self._whole[ended]]
        self.finished_returns.extend(self._returns[whole].tolist())
        self.finished_lengths.extend(self._lengths[whole].tolist())
        self.episodes += whole.size
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        self._whole[ended] = True

    def cut(self, envs: np.ndarray | slice = slice(None)) -> None:
        """The step stream (of ``envs``, by default all) was interrupted: the episodes in
        progress are not counted."""
        self._returns[envs] = 0.0
        self._lengths[envs] = 0
        self._whole[envs] = False

    def state(self) -> dict[str, list[float] | int]:
        """The finished-episode windows and count, for a checkpoint (JSON-friendly)."""
        return {
            "returns": [float(r) for r in self.finished_returns],
            "lengths": [int(n) for n in self.finished_lengths],
            "episodes": int(self.episodes),
        }

    def load_state(self, state: dict) -> None:
        """Continue from ``state()``: a resumed run reports the same mean return."""
        self.finished_returns.clear()
        self.finished_returns.extend(float(r) for r in state.get("returns", []))
        self.finished_lengths.clear()
        self.finished_lengths.extend(int(n) for n in state.get("lengths", []))
        self.episodes = int(state.get("episodes", len(self.finished_returns)))

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.finished_returns)) if self.finished_returns else float("nan")

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.finished_lengths)) if self.finished_lengths else float("nan")
