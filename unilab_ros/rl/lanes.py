"""Fills a rollout from envs that step on their own (a fleet of robots), real steps only.

The buffer is a (T, N) grid: N lanes of T slots, one column each. Env e writes its steps
into a lane of its own, lane e while that has room. A lane's steps need not all come
from one env, only each segment of it: when an env's stream breaks (its robot stalled)
its last stored step becomes a time-out (GAE bootstraps there and never runs across the
gap) and it lets go of the lane; an env whose lane is full moves on to a free lane,
whose last step, if any, is such a cut. So when a robot drops out, the others fill its
slots with their own steps, every slot holds a step that was taken, and the rollout
keeps the shape (and the compiled update) of a full one. An env finds no free lane only
when the rollout is all but complete; its steps then go unstored until the update (its
last stored step bootstraps from the observation after it, as at any rollout's end).
"""

from __future__ import annotations

import numpy as np

from unilab_ros.rl.agent import PPOAgent, StepOfEnvs

_NO_LANE = -1


class LaneRollout:
    """Where each env's next step goes in ``agent``'s buffer; see the module docstring."""

    def __init__(self, agent: PPOAgent) -> None:
        self.agent = agent
        buffer = agent.buffer
        self.num_steps, num_lanes = buffer.num_steps, buffer.num_envs
        self.filled = np.zeros(num_lanes, np.int64)
        """Slots of each lane that hold a step."""
        self.lane_of = np.full(num_lanes, _NO_LANE, np.int64)
        """Each env's lane (envs and lanes are as many), or -1 while it has none."""
        self.bootstrap_obs = np.zeros((num_lanes, buffer.obs_dim), np.float32)
        """The observation after each lane's last step: the update's last values."""

    @property
    def full(self) -> bool:
        return bool((self.filled == self.num_steps).all())

    def record(self, envs: np.ndarray, step: StepOfEnvs, next_obs: np.ndarray) -> bool:
        """Store the step of ``envs`` (rows of ``step`` and ``next_obs``) where each has
        room; True when the rollout is full."""
        lanes = np.array([self._lane_for(env) for env in envs], np.int64)
        stored = lanes != _NO_LANE
        if stored.any():
            rows, at = lanes[stored], self.filled[lanes[stored]]
            self.agent.record_rows(at, rows, StepOfEnvs(
                step.obs[stored], step.actions[stored], _rows(step.mean, stored),
                _rows(step.std, stored), step.rewards[stored], step.dones[stored],
            ), sources=envs[stored])
            self.bootstrap_obs[rows] = next_obs[stored]
            self.filled[rows] += 1
        if self.full:
            self.agent.buffer.mark_full()
        return self.full

    def cut(self, envs: np.ndarray) -> None:
        """The streams of ``envs`` broke: their last stored steps become time-outs and
        their lanes are free for others."""
        lanes = self.lane_of[envs]
        lanes = lanes[(lanes != _NO_LANE) & (self.filled[np.maximum(lanes, 0)] > 0)]
        self.agent.buffer.truncate_at(self.filled[lanes] - 1, lanes)
        self.lane_of[envs] = _NO_LANE

    def clear(self) -> None:
        """After the update: every env starts over in its own lane."""
        self.filled[:] = 0
        self.lane_of[:] = _NO_LANE

    def _lane_for(self, env: int) -> int:
        """The lane ``env``'s step goes into (-1: none has room)."""
        lane = self.lane_of[env]
        if lane != _NO_LANE and self.filled[lane] < self.num_steps:
            return int(lane)
        free = (self.filled < self.num_steps) & ~np.isin(np.arange(len(self.filled)),
                                                         self.lane_of)
        # Its own lane first: with no robot stalled, the rollout is laid out as usual.
        lane = env if free[env] else int(np.argmax(free)) if free.any() else _NO_LANE
        self.lane_of[env] = lane
        return lane


def _rows(values: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """The stored rows of a per-row array; a single row (a state-independent std) as is."""
    return values[stored] if len(values) == len(stored) else values
