"""On-policy rollout storage for vectorized environments, preallocated as (T, N, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from unilab_ros.rl.done_codes import DoneCode

RUNNING, TERMINATED, TRUNCATED = DoneCode.RUNNING, DoneCode.TERMINATED, DoneCode.TRUNCATED


class MiniBatch(NamedTuple):
    """One shuffled slice of the rollout, a row per sample; "old" are the acting policy's
    outputs. A tuple, so ``mx.compile`` takes it as a tree of arrays."""

    obs: mx.array
    actions: mx.array
    old_log_probs: mx.array
    old_mean: mx.array
    old_std: mx.array
    returns: mx.array
    advantages: mx.array
    """As the buffer holds them: the trainer normalizes them over the rollout before
    serving the mini-batches, or in each one."""
    old_values: mx.array


def split_sizes(total: int, parts: int) -> list[int]:
    """``parts`` sizes summing to ``total`` that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


class RolloutBuffer:
    """Stores one rollout, computes GAE returns, and serves shuffled mini-batches.

    Steps are added one at a time as numpy rows (cheap in a per-step callback).
    The acting policy's outputs (log-prob, mean, std) come with each step or are filled
    in for the whole rollout at once with ``set_policy_outputs``.
    A done code of 2 (time-out) ends the segment for GAE but adds ``gamma * V(s_t)``
    to the step's reward, as rsl_rl does, so a cut episode is not treated as a failure.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_dim: int,
        action_dim: int,
        gamma: float,
        lam: float,
        dtype: Any | None = None,
    ) -> None:
        if min(num_steps, num_envs, obs_dim, action_dim) <= 0:
            raise ValueError("buffer sizes must be positive")
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.gamma = gamma
        self.lam = lam
        self.dtype = mx.float32 if dtype is None else dtype
        shape = (num_steps, num_envs)
        self.observations = np.zeros((*shape, obs_dim), np.float32)
        self.actions = np.zeros((*shape, action_dim), np.float32)
        self.log_probs = np.zeros(shape, np.float32)
        self.mean = np.zeros((*shape, action_dim), np.float32)
        self.std = np.zeros((*shape, action_dim), np.float32)
        self.rewards = np.zeros(shape, np.float32)
        self.dones = np.zeros(shape, np.uint8)
        self.values = np.zeros(shape, np.float32)
        self.advantages = np.zeros(shape, np.float32)
        self.returns = np.zeros(shape, np.float32)
        self.step = 0

    @property
    def full(self) -> bool:
        return self.step >= self.num_steps

    def add(
        self,
        *,
        obs: Any,
        actions: Any,
        rewards: Any,
        dones: Any,
        log_probs: Any | None = None,
        mean: Any | None = None,
        std: Any | None = None,
    ) -> None:
        """Append one step of every env: what it saw, did and got, and the acting policy's
        log-prob, mean and std of its actions (or none, filled in later for the whole
        rollout by ``set_policy_outputs``). The values are computed at the update."""
        if self.step >= self.num_steps:
            raise OverflowError("Rollout buffer overflow.")
        t = self.step
        self.observations[t] = np.asarray(obs).reshape(self.num_envs, self.obs_dim)
        self.actions[t] = np.asarray(actions).reshape(self.num_envs, self.action_dim)
        self.rewards[t] = np.asarray(rewards).reshape(self.num_envs)
        self.dones[t] = np.asarray(dones).reshape(self.num_envs)
        if log_probs is not None:
            self.log_probs[t] = np.asarray(log_probs).reshape(self.num_envs)
        if mean is not None:
            self.mean[t] = np.asarray(mean).reshape(self.num_envs, self.action_dim)
        if std is not None:
            self.std[t] = np.broadcast_to(np.asarray(std), self.mean[t].shape)
        self.step += 1

    def put(
        self,
        steps: np.ndarray,
        envs: np.ndarray,
        *,
        obs: Any,
        actions: Any,
        rewards: Any,
        dones: Any,
        log_probs: Any,
        mean: Any,
        std: Any,
    ) -> None:
        """Store one step of some envs, each at its own time index (``steps[k]`` of column
        ``envs[k]``), for sources that step on their own (see ``lanes``); ``step`` does not
        move: ``mark_full`` says when every slot holds a step."""
        count = len(envs)
        self.observations[steps, envs] = np.asarray(obs).reshape(count, self.obs_dim)
        self.actions[steps, envs] = np.asarray(actions).reshape(count, self.action_dim)
        self.rewards[steps, envs] = np.asarray(rewards).reshape(count)
        self.dones[steps, envs] = np.asarray(dones).reshape(count)
        self.log_probs[steps, envs] = np.asarray(log_probs).reshape(count)
        self.mean[steps, envs] = np.asarray(mean).reshape(count, self.action_dim)
        self.std[steps, envs] = np.broadcast_to(np.asarray(std), (count, self.action_dim))

    def mark_full(self) -> None:
        """Every slot was filled through ``put``: the rollout is complete."""
        self.step = self.num_steps

    def truncate_at(self, steps: np.ndarray, envs: np.ndarray) -> None:
        """Mark step ``steps[k]`` of column ``envs[k]`` a time-out where it was running."""
        last = self.dones[steps, envs]
        self.dones[steps, envs] = np.where(last == RUNNING, TRUNCATED, last)

    def set_policy_outputs(
        self, log_probs: Any, action_mean: Any, action_std: Any, values: Any
    ) -> None:
        """Fill the policy outputs of all stored steps at once, each shaped (T, N, ...)."""
        t = self.step
        self.log_probs[:t] = np.asarray(log_probs).reshape(t, self.num_envs)
        self.mean[:t] = np.asarray(action_mean).reshape(t, self.num_envs, self.action_dim)
        std = np.asarray(action_std)
        # A state-independent std may come as one row; assignment broadcasts it.
        self.std[:t] = std.reshape(self.mean[:t].shape if std.size > self.action_dim else -1)
        self.values[:t] = np.asarray(values).reshape(t, self.num_envs)

    def compute_returns_and_advantages(self, last_values: Any) -> None:
        """GAE(lambda) over the stored steps; the advantages stay raw (the trainer owns
        their normalization, over the rollout or per mini-batch)."""
        if self.step != self.num_steps:
            raise RuntimeError(f"rollout holds {self.step} of {self.num_steps} steps")
        last_values = np.asarray(last_values, np.float32).reshape(self.num_envs)
        dones = self.dones.astype(np.float32)
        rewards = self.rewards + self.gamma * self.values * (self.dones == TRUNCATED)
        next_non_terminal = 1.0 - np.minimum(dones, 1.0)
        next_values = np.concatenate([self.values[1:], last_values[None]], axis=0)
        deltas = rewards + self.gamma * next_values * next_non_terminal - self.values
        gae = np.zeros(self.num_envs, np.float32)
        for t in reversed(range(self.num_steps)):
            gae = deltas[t] + self.gamma * self.lam * next_non_terminal[t] * gae
            self.advantages[t] = gae
        self.returns[:] = self.advantages + self.values

    def mini_batch_generator(
        self, num_mini_batches: int, num_epochs: int, key: mx.array | None = None
    ) -> Iterator[MiniBatch]:
        """Yield ``num_epochs`` shuffled passes, each split into ``num_mini_batches``.

        Every sample is used exactly once per epoch; mini-batch sizes differ by at
        most one, so a compiled update step sees at most two shapes. ``key`` makes
        the shuffles reproducible (one sub-key per epoch); without it MLX's global
        generator is used.
        """
        batch_size = self.num_steps * self.num_envs
        if not 0 < num_mini_batches <= batch_size:
            raise ValueError(f"num_mini_batches must be in 1..{batch_size}")

        def rows(stored: np.ndarray) -> mx.array:
            """(T, N, ...) -> (T * N, ...), a sample per row."""
            return mx.array(stored.reshape(batch_size, *stored.shape[2:]), dtype=self.dtype)

        data = MiniBatch(
            obs=rows(self.observations),
            actions=rows(self.actions),
            old_log_probs=rows(self.log_probs),
            old_mean=rows(self.mean),
            old_std=rows(self.std),
            returns=rows(self.returns),
            advantages=rows(self.advantages),
            old_values=rows(self.values),
        )
        bounds = np.cumsum([0, *split_sizes(batch_size, num_mini_batches)])
        keys = mx.random.split(key, num_epochs) if key is not None else [None] * num_epochs
        for epoch_key in keys:
            shuffled = mx.random.permutation(batch_size, key=epoch_key)
            for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
                idx = shuffled[int(start) : int(stop)]
                yield MiniBatch(*(value[idx] for value in data))

    def clear(self) -> None:
        self.step = 0
