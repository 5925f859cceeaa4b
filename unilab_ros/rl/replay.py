"""ReplayBuffer: a bounded ring of transitions for the off-policy learner.

Steps arrive as PPO's do: ``add(obs, actions, rewards, dones)`` for every env at once
(``rewards`` and ``dones`` are what the env returned for ``actions`` in ``obs``), and the
next state of a running env only comes with the next call. So a running env's transition
waits, pending, until its next observation arrives; until then it is never sampled.

Done codes mean what they mean in the rollout buffer:

- TERMINATED: the episode ended for good, no bootstrap (``terminal`` 1).
- TRUNCATED (a time limit, a dropped step, a segment cut): bootstrap. The next state of a
  cut episode is not on the wire (the env sends the first observation of the next
  episode instead), so the target bootstraps from the state the step started in, as the
  rollout buffer adds gamma * V(s_t): the same approximation rsl_rl makes.

Observations are stored raw and normalized when sampled, so a change of the observation
statistics never changes what a stored observation means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unilab_ros.rl.done_codes import DoneCode

_NO_PENDING = -1
_ROWS = ("obs", "actions", "rewards", "next_obs", "terminal", "ready")
"""The per-row arrays, allocated for the whole capacity."""


@dataclass(frozen=True)
class Transitions:
    """A sampled batch (rows: transitions), raw observations."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminal: np.ndarray
    """1.0 where the episode ended for good (no bootstrap), else 0.0."""


class ReplayBuffer:
    """At most ``capacity`` transitions of ``num_envs`` envs; the oldest are overwritten."""

    def __init__(self, capacity: int, num_envs: int, obs_dim: int, action_dim: int) -> None:
        if capacity < num_envs:
            raise ValueError(f"replay capacity {capacity} is below num_envs {num_envs}")
        self.capacity = int(capacity)
        self.num_envs = int(num_envs)
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, action_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.terminal = np.zeros(capacity, np.float32)
        self.ready = np.zeros(capacity, bool)
        """Whether the row's next state is known (a running env's waits for its next step)."""
        self.pending = np.full(num_envs, _NO_PENDING, np.int64)
        """Per env, the row waiting for its next observation, or -1."""
        self.position = 0
        """The next row written."""
        self.size = 0
        """Rows written so far, up to ``capacity``."""
        self.added = 0
        """Transitions added over the buffer's life (restored with it)."""

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, envs: np.ndarray | None = None,
            next_obs: np.ndarray | None = None) -> None:
        """Store one step of ``envs`` (default: all, in order); ``obs`` completes each env's
        pending transition first. With ``next_obs`` (the states the step led to, known to a
        caller that pairs steps) the running envs' transitions are complete at once."""
        envs = np.arange(self.num_envs) if envs is None else np.asarray(envs, np.int64)
        obs = np.asarray(obs, np.float32).reshape(len(envs), -1)
        self._complete(envs, obs)
        rows = (self.position + np.arange(len(envs))) % self.capacity
        # A row about to be overwritten may be some env's pending transition: that one is
        # lost, and the env must not later write its next state over the new row.
        self.pending[np.isin(self.pending, rows)] = _NO_PENDING
        dones = np.asarray(dones).reshape(-1)
        self.obs[rows] = obs
        self.actions[rows] = np.asarray(actions, np.float32).reshape(len(envs), -1)
        self.rewards[rows] = np.asarray(rewards, np.float32).reshape(-1)
        self.terminal[rows] = (dones == DoneCode.TERMINATED).astype(np.float32)
        ended = dones != DoneCode.RUNNING
        # A cut episode bootstraps from the state its last step started in (module doc).
        self.next_obs[rows[ended]] = obs[ended]
        if next_obs is not None:
            running = ~ended
            self.next_obs[rows[running]] = np.asarray(next_obs, np.float32).reshape(
                len(envs), -1)[running]
            ended = np.ones_like(ended)
        self.ready[rows] = ended
        self.pending[envs] = np.where(ended, _NO_PENDING, rows)
        self.position = int((self.position + len(envs)) % self.capacity)
        self.size = min(self.size + len(envs), self.capacity)
        self.added += len(envs)

    def __getstate__(self) -> dict:
        """Pickled (to a learner process) with its written rows only: rows fill from the
        first, so the unwritten rest of the capacity is zeros the receiver allocates."""
        state = self.__dict__.copy()
        for name in _ROWS:
            state[name] = state[name][: self.size]
        return state

    def __setstate__(self, state: dict) -> None:
        for name in _ROWS:
            rows = state[name]
            full = np.zeros((state["capacity"], *rows.shape[1:]), rows.dtype)
            full[: len(rows)] = rows
            state[name] = full
        self.__dict__.update(state)

    def cut(self, envs: np.ndarray | None = None) -> None:
        """End the pending transitions of ``envs`` as time-outs (the next state they would
        get is not the one their action led to: a dropped step, a pause, a rival)."""
        envs = np.arange(self.num_envs) if envs is None else np.asarray(envs, np.int64)
        rows = self.pending[envs]
        rows = rows[rows != _NO_PENDING]
        self.next_obs[rows] = self.obs[rows]
        self.ready[rows] = True
        self.pending[envs] = _NO_PENDING

    def _complete(self, envs: np.ndarray, obs: np.ndarray) -> None:
        rows = self.pending[envs]
        waiting = rows != _NO_PENDING
        self.next_obs[rows[waiting]] = obs[waiting]
        self.ready[rows[waiting]] = True

    @property
    def sampleable(self) -> int:
        """Transitions a batch can be drawn from."""
        return int(np.count_nonzero(self.ready[: self.size]))

    def sample(self, batch_size: int, rng: np.random.Generator) -> Transitions:
        """``batch_size`` transitions drawn uniformly (with replacement) from the ready ones."""
        if self.sampleable == 0:
            raise ValueError("the replay buffer holds no complete transition yet")
        rows = rng.integers(0, self.size, batch_size)
        # At most num_envs rows wait for their next state: redraw those (rarely many).
        for _ in range(64):
            waiting = ~self.ready[rows]
            if not waiting.any():
                break
            rows[waiting] = rng.integers(0, self.size, int(waiting.sum()))
        else:
            ready = np.flatnonzero(self.ready[: self.size])
            rows = rng.choice(ready, batch_size)
        return Transitions(self.obs[rows], self.actions[rows], self.rewards[rows],
                           self.next_obs[rows], self.terminal[rows])

    def state_dict(self) -> dict[str, np.ndarray]:
        """The stored rows, oldest first, for a checkpoint (pending rows count as cut: a
        restart never sees the next state they waited for)."""
        order = (np.arange(self.size) + (self.position if self.size == self.capacity else 0)
                 ) % self.capacity
        ready = self.ready[order].copy()
        next_obs = self.next_obs[order].copy()
        waiting = ~ready
        next_obs[waiting] = self.obs[order][waiting]
        return {"obs": self.obs[order], "actions": self.actions[order],
                "rewards": self.rewards[order], "next_obs": next_obs,
                "terminal": self.terminal[order],
                "added": np.array(self.added, np.int64)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Take rows saved by ``state_dict`` (of this or another run of the same sizes); the
        newest ``capacity`` are kept."""
        obs = np.asarray(state["obs"], np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.obs.shape[1]:
            raise ValueError(f"replay observations of shape {obs.shape} do not fit obs_dim "
                             f"{self.obs.shape[1]}")
        actions = np.asarray(state["actions"], np.float32)
        if actions.shape != (len(obs), self.actions.shape[1]):
            raise ValueError(f"replay actions of shape {actions.shape} do not fit "
                             f"action_dim {self.actions.shape[1]}")
        keep = slice(max(len(obs) - self.capacity, 0), len(obs))
        count = len(obs[keep])
        self.obs[:count] = obs[keep]
        self.actions[:count] = actions[keep]
        self.rewards[:count] = np.asarray(state["rewards"], np.float32)[keep]
        self.next_obs[:count] = np.asarray(state["next_obs"], np.float32)[keep]
        self.terminal[:count] = np.asarray(state["terminal"], np.float32)[keep]
        self.ready[:count] = True
        self.ready[count:] = False
        self.pending[:] = _NO_PENDING
        self.size = count
        self.position = count % self.capacity
        self.added = int(state.get("added", count))
