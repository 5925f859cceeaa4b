"""Keeping the best policy of a run: PPO can look solved and then fall apart."""

from __future__ import annotations

import math

import numpy as np

from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.episodes import EpisodeStats


class BestPolicy:
    """Tracks the highest mean return over the last ``min_episodes`` finished episodes.

    Offered the agent after every update, it remembers the model's arrays (MLX arrays
    are immutable, so this costs references) and the iteration whenever that rolling
    mean beats the best so far (``offer`` says so; the trainer then saves
    ``best.safetensors``). The rolling mean lags the policy by the episodes it
    spans, so the kept policy is the one acting when a window of good episodes closed.
    """

    def __init__(self, min_episodes: int = 100) -> None:
        if min_episodes < 1:
            raise ValueError("min_episodes must be >= 1")
        self.min_episodes = min_episodes
        self.mean_return = -math.inf
        self.iteration = 0
        self.env_steps = 0
        self.parameters: dict | None = None

    def keep_stored(self, mean_return: float, iteration: int) -> None:
        """A best kept earlier (the ``best.safetensors`` of the run folder a new run
        writes into): only a higher mean return replaces it. A non-finite score keeps none."""
        if math.isfinite(mean_return):
            self.mean_return = mean_return
            self.iteration = iteration

    def offer(self, agent: PPOAgent, stats: EpisodeStats) -> bool:
        """True when the agent's current policy is the new best."""
        returns = list(stats.finished_returns)
        if len(returns) < self.min_episodes:
            return False
        mean = float(np.mean(returns[-self.min_episodes:]))
        if not math.isfinite(mean) or mean <= self.mean_return:
            return False
        self.mean_return = mean
        self.iteration = agent.iteration
        self.env_steps = agent.env_steps
        self.parameters = agent.model.parameters()
        return True
