"""A Gymnasium vector env with flat float32 arrays in and out (ROS-free).

The Gymnasium bridge node serves it over the topic contract; the in-process demo and the
learning bench step the very same class, so both paths see identical environments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from unilab_ros.rl.done_codes import from_gym_flags

RETURN_WINDOW = 100


class GymEnvConfigError(Exception):
    """A parameter or environment the node cannot serve; the message is one line."""


@dataclass(frozen=True)
class VectorStep:
    """What one action produced: the arrays published on the three topics."""

    observation: np.ndarray  # (num_envs, obs_dim) float32, reset state for an env that ended
    reward: np.ndarray  # (num_envs,) float32, of the step that was taken
    done: np.ndarray  # (num_envs,) uint8 done codes of the step that was taken


class GymVectorSim:
    """The ROS-free side: a vector env with flat arrays in and out, clipping and returns."""

    def __init__(self, env_id: str, num_envs: int, seed: int, max_episode_steps: int) -> None:
        # SAME_STEP: an env that ends is reset within the same step, so the step returns the
        # ending step's reward and flags with the first observation of the new episode.
        self._envs = gym.vector.SyncVectorEnv(
            [_env_factory(env_id, max_episode_steps)] * num_envs,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        try:
            self._check_spaces(env_id)
        except GymEnvConfigError:
            self._envs.close()
            raise
        action_space = self._envs.single_action_space
        self.num_envs = num_envs
        self.obs_dim = int(np.prod(self._envs.single_observation_space.shape))
        self.action_dim = int(np.prod(action_space.shape))
        self._action_shape = (num_envs, *action_space.shape)
        self._action_dtype = action_space.dtype
        self._action_low = action_space.low.reshape(-1)
        self._action_high = action_space.high.reshape(-1)
        self._seed = seed
        self._running_returns = np.zeros(num_envs)
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.steps = 0
        self.episodes = 0

    def _check_spaces(self, env_id: str) -> None:
        for role, space in (('observation', self._envs.single_observation_space),
                            ('action', self._envs.single_action_space)):
            if not isinstance(space, gym.spaces.Box):
                raise GymEnvConfigError(
                    f'{env_id} has a {type(space).__name__} {role} space; only Box '
                    'observation and action spaces are supported')

    def reset(self) -> np.ndarray:
        """The first (num_envs, obs_dim) observation; env i is seeded with seed + i."""
        observation, _ = self._envs.reset(seed=self._seed)
        return self._flat_observation(observation)

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step every env with (num_envs, action_dim) actions, clipped to the action space."""
        clipped = np.clip(actions, self._action_low, self._action_high)
        observation, reward, terminated, truncated, _ = self._envs.step(
            clipped.reshape(self._action_shape).astype(self._action_dtype, copy=False))
        done = from_gym_flags(terminated, truncated)
        self._track_returns(reward, done)
        return VectorStep(self._flat_observation(observation),
                          np.asarray(reward, dtype=np.float32), done)

    def mean_return(self, last: int = RETURN_WINDOW) -> float | None:
        """Mean return of the `last` finished episodes (at most RETURN_WINDOW), if any."""
        returns = list(self.recent_returns)[-last:] if last > 0 else []
        return float(np.mean(returns)) if returns else None

    def close(self) -> None:
        self._envs.close()

    def _track_returns(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.steps += 1
        self._running_returns += reward
        ended = done != 0
        self.recent_returns.extend(self._running_returns[ended].tolist())
        self.episodes += int(ended.sum())
        self._running_returns[ended] = 0.0

    def _flat_observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32).reshape(self.num_envs, self.obs_dim)


def _env_factory(env_id: str, max_episode_steps: int) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        try:
            return gym.make(env_id, max_episode_steps=max_episode_steps or None)
        except (gym.error.Error, ImportError) as error:
            # e.g. an unknown id, or MuJoCo envs without their optional dependencies.
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise GymEnvConfigError(f'cannot create {env_id}: {reason}') from error
    return make
