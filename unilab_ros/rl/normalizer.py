"""Running mean / variance observation normalizer (part of the model's state)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

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
        batch_mean = mx.mean(batch, axis=0)
        batch_var = mx.var(batch, axis=0)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (n / total)
        merged = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.var = merged / total
        self.count = total
        mx.eval(self.mean, self.var, self.count)
