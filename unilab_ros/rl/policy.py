"""Acting with a model on numpy observations: mean or sampled actions."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from unilab_ros.rl.model import MLPActorCritic


class PolicySampler:
    """Actions for raw observations; its own random key makes sampling reproducible."""

    def __init__(self, model: MLPActorCritic, seed: int) -> None:
        self.model = model
        self.key = mx.random.key(seed)

    def __call__(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        mean = self.model.policy(mx.array(obs))
        if deterministic:
            return np.array(mean)
        self.key, key = mx.random.split(self.key)
        std, _ = self.model.std_and_log_std()
        return np.array(mean + std * mx.random.normal(mean.shape, key=key))
