"""Running mean / variance normalizers: of observations (part of the model's state) and of
discounted returns (rewards scaled as Stable-Baselines3's VecNormalize does)."""

from __future__ import annotations

from typing import TypeVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

Moments = TypeVar("Moments", mx.array, np.ndarray)

WARMUP_SAMPLES = 1000
"""Samples merged as they come before outliers are clipped: the statistics need that many
to say what an outlier is (one Pendulum rollout is 3,072; a robot's of 24 steps, 42)."""


class RunningNormalizer(nn.Module):
    """Normalizes inputs with statistics merged batch by batch (Chan et al.).

    Once ``warmup`` samples are in, each new sample enters the statistics clipped to what
    the policy sees of it, ``mean +- clip * sqrt(var + epsilon)`` of the statistics before
    its batch: a sensor glitch of a few steps (1e4, 1e6) then moves the variance by a
    little, where it used to set it to the glitch's square for the rest of the run. A
    sample inside the bounds enters unchanged, so without outliers the statistics, and
    training, are bit for bit those of a plain running normalizer. A real change of range
    is still followed: each batch widens the bounds (by up to ``clip`` standard
    deviations of its samples).

    Its arrays are frozen parameters: saved and restored with the model, never
    touched by the optimizer.
    """

    def __init__(
        self, size: int, epsilon: float = 1e-8, clip: float = 10.0,
        warmup: int = WARMUP_SAMPLES,
    ) -> None:
        super().__init__()
        self.mean = mx.zeros((size,))
        self.var = mx.ones((size,))
        self.count = mx.zeros(())
        self._epsilon = epsilon
        self._clip = clip
        self._warmup = warmup
        self.freeze()

    @property
    def epsilon(self) -> float:
        """Added to the variance before its square root."""
        return self._epsilon

    @property
    def clip(self) -> float:
        """Normalized values are clipped to +-this."""
        return self._clip

    @property
    def std(self) -> mx.array:
        """What the inputs are divided by: sqrt(var + epsilon)."""
        return mx.sqrt(self.var + self._epsilon)

    def __call__(self, x: mx.array) -> mx.array:
        z = (x - self.mean) * mx.rsqrt(self.var + self._epsilon)
        return mx.clip(z, -self._clip, self._clip)

    def update(self, batch: mx.array) -> None:
        """Merge the statistics of ``batch`` (rows are samples) into the running ones."""
        batch = batch.reshape(-1, self.mean.shape[0])
        n = batch.shape[0]
        if n == 0:
            return
        if float(self.count.item()) >= self._warmup:
            reach = self._clip * mx.sqrt(self.var + self._epsilon)
            low, high = self.mean - reach, self.mean + reach
            # Clipped only when needed: a clipped copy of an untouched batch holds the same
            # values, but in another buffer MLX's sums may round differently.
            if bool(mx.any((batch < low) | (batch > high)).item()):
                batch = mx.clip(batch, low, high)
        self.mean, self.var, self.count = merge_moments(
            (self.mean, self.var, self.count), mx.mean(batch, axis=0), mx.var(batch, axis=0), n
        )
        mx.eval(self.mean, self.var, self.count)


def merge_moments(
    running: tuple[Moments, Moments, Moments], batch_mean: Moments, batch_var: Moments, n: int
) -> tuple[Moments, Moments, Moments]:
    """(mean, var, count) of the running statistics with a batch of ``n`` samples merged in
    (Chan et al.); arithmetic only, so MLX and numpy arrays alike."""
    mean, var, count = running
    total = count + n
    delta = batch_mean - mean
    merged = var * count + batch_var * n + delta * delta * (count * n / total)
    return mean + delta * (n / total), merged / total, total


class ReturnNormalizer:
    """Rewards divided by the running std of each env's discounted return, as
    Stable-Baselines3's ``VecNormalize(norm_reward=True)`` and CleanRL's
    ``NormalizeReward`` do: per env ``R = gamma * R + r``, reset to 0 after a step that
    ends the episode (terminated or truncated); every step's returns of all envs enter
    the running variance, and the reward goes out as ``r / sqrt(var + epsilon)`` (with the
    variance that includes this step), clipped to +-``clip``. The mean is not subtracted:
    that would change which behaviour the rewards favour (a reward that is positive for
    staying alive would turn negative).

    In numpy, float32: it runs on every acting step, where MLX's fixed cost per op is
    large (see ``policy``), and float32 arrays are stored in checkpoints as they are, so a
    resumed run continues bit-exactly. ``state`` is what a checkpoint keeps.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float, epsilon: float = 1e-8) -> None:
        self.gamma = np.float32(gamma)
        self.clip = np.float32(clip)
        self.epsilon = np.float32(epsilon)
        self.mean = np.zeros((), np.float32)
        self.var = np.ones((), np.float32)
        self.count = np.zeros((), np.float32)
        self.returns = np.zeros(num_envs, np.float32)
        """Each env's discounted return so far in its episode."""

    def __call__(
        self, rewards: np.ndarray, dones: np.ndarray, envs: np.ndarray | slice = slice(None)
    ) -> np.ndarray:
        """The normalized rewards of one step of the envs ``envs`` (by default all)."""
        rewards = np.asarray(rewards, np.float32)
        returns = self.returns[envs] * self.gamma + rewards
        self.mean, self.var, self.count = merge_moments(
            (self.mean, self.var, self.count), returns.mean(), returns.var(), returns.size
        )
        self.returns[envs] = np.where(np.asarray(dones) != 0, np.float32(0.0), returns)
        scaled = rewards / np.sqrt(self.var + self.epsilon)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """The running statistics and returns, by name (``normalizer.*`` as the model's)."""
        return {"normalizer.mean": self.mean, "normalizer.var": self.var,
                "normalizer.count": self.count, "returns": self.returns}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from ``state()`` (names and shapes checked by the caller)."""
        self.mean, self.var, self.count = (
            np.array(state[f"normalizer.{name}"], np.float32).reshape(())
            for name in ("mean", "var", "count")
        )
        self.returns = np.array(state["returns"], np.float32).reshape(self.returns.shape)
