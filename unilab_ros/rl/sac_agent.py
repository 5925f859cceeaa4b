"""SACAgent: acting, storing steps in replay and learning, independent of how steps arrive.

Acting runs a numpy copy of the actor (as PPO's ``PolicySampler`` does: MLX's fixed cost
per op outweighs a few rows of arithmetic), taken again after each ``learn``. Its actions
are squashed to [-1, 1] and mapped onto ``action_bounds`` (policy units: what the action
mapper then scales to the robot's command); before ``learning_starts`` env steps they are
drawn uniformly over the bounds. Recorded actions are mapped back to [-1, 1], the space
the critics see.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from unilab_ros.rl.agent import AgentConfig, StepOfEnvs
from unilab_ros.rl.policy import _NUMPY_ACTIVATIONS
from unilab_ros.rl.replay import ReplayBuffer
from unilab_ros.rl.sac import SACLearner, SACModel
from unilab_ros.rl.sac_config import SACConfig

_LOG = logging.getLogger(__name__)
METRICS = ("critic_loss", "actor_loss", "alpha_loss", "entropy_coef", "entropy")


class _NumpyActor:
    """The actor's arrays in numpy: squashed mean or sampled actions for a few rows. Plain
    arrays and names, so a learner process can send one (``of`` builds it from a model)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]],
                 normalization: tuple[np.ndarray, np.ndarray, np.float32] | None,
                 activation: str, log_std_bounds: tuple[float, float]) -> None:
        self.layers = layers
        self.normalization = normalization
        self.activation_name = activation
        self.activation = _NUMPY_ACTIVATIONS[activation]
        self.log_std_bounds = log_std_bounds

    @classmethod
    def of(cls, model: SACModel) -> _NumpyActor:
        normalizer = model.normalizer
        normalization = None
        if model.cfg.normalize_observations:
            scale = 1.0 / np.sqrt(np.array(normalizer.var) + np.float32(normalizer.epsilon))
            normalization = (np.array(normalizer.mean), scale.astype(np.float32),
                             np.float32(normalizer.clip))
        layers = [(np.ascontiguousarray(np.array(layer.weight).T), np.array(layer.bias))
                  for layer in model.actor.layers]
        return cls(layers, normalization, model.cfg.activation,
                   (model.cfg.log_std_min, model.cfg.log_std_max))

    def __reduce__(self) -> tuple:
        # The activation is a lambda: it travels by name.
        return (type(self), (self.layers, self.normalization, self.activation_name,
                             self.log_std_bounds))

    def __call__(self, obs: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        x = obs
        if self.normalization is not None:
            shift, scale, clip = self.normalization
            x = np.clip((x - shift) * scale, -clip, clip)
        *hidden, (weight, bias) = self.layers
        for hidden_weight, hidden_bias in hidden:
            x = self.activation(x @ hidden_weight + hidden_bias)
        mean, log_std = np.split(x @ weight + bias, 2, axis=-1)
        if rng is None:
            return np.tanh(mean)
        std = np.exp(np.clip(log_std, *self.log_std_bounds))
        return np.tanh(mean + std * rng.standard_normal(mean.shape, dtype=np.float32))


class SACAgent:
    """Owns the model, the replay buffer and the learner of one off-policy session.

    It offers what the training loop asks of PPO's agent: ``cfg`` (sizes; ``num_steps``
    is the env steps per env between two learning phases), ``act``, ``collector`` (where
    the loop's steps go), ``update`` (a learning phase: the gradient steps owed),
    ``iteration`` (learning phases so far) and ``model``."""

    def __init__(self, cfg: AgentConfig, sac_cfg: SACConfig | None = None,
                 action_bounds: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        cfg.validate()
        if cfg.normalize_rewards:
            raise ValueError("normalize_rewards follows PPO's discounted returns; the "
                             "off-policy learner takes reward_scale only")
        sac_cfg = sac_cfg or SACConfig()
        sac_cfg.validate()
        self.cfg, self.sac_cfg = cfg, sac_cfg
        num_envs, obs_dim, action_dim, seed = cfg.num_envs, cfg.obs_dim, cfg.action_dim, cfg.seed
        self.num_envs, self.obs_dim, self.action_dim = num_envs, obs_dim, action_dim
        mx.random.seed(seed)
        self.model = SACModel(obs_dim, action_dim, sac_cfg)
        mx.eval(self.model.parameters())
        self.learner = SACLearner(self.model, seed + 1)
        self.replay = ReplayBuffer(sac_cfg.buffer_size, num_envs, obs_dim, action_dim)
        low, high = action_bounds or (-np.ones(action_dim), np.ones(action_dim))
        self.low = np.asarray(low, np.float32).reshape(action_dim)
        self.half_range = (np.asarray(high, np.float32).reshape(action_dim) - self.low) / 2
        self._act_rng = np.random.default_rng(seed + 2)
        self._batch_rng = np.random.default_rng(seed + 3)
        self._actor = _NumpyActor.of(self.model)
        self.iteration = 0
        """Learning phases run (``update`` calls; the first ones, before ``learning_starts``,
        take no gradient step), so ``iteration x num_envs x num_steps`` env steps were
        collected, as with PPO."""
        self.env_steps = 0
        self.updates_owed = 0.0
        """Gradient steps the update-to-data ratio has asked for and not yet run."""
        self.nonfinite_steps = 0
        """Gradient steps whose losses were not finite (rolled back, counted)."""
        self.model_lock = threading.RLock()
        """Held by whoever computes with the model in MLX: the learner, and a checkpoint,
        bundle or parameter check of the control thread while a learner thread runs (MLX
        evaluation from two threads at once is not safe, ml-explore/mlx#2067)."""
        self._replay_lock = threading.Lock()
        self._unmerged_obs: list[np.ndarray] = []
        self.actor_steps = 0
        """The gradient steps behind the actor that acts (the policy lag is the learner's
        steps beyond it)."""
        self.good_parameters = self.model.parameters()
        """The model's latest parameters after a learning call whose steps were all finite
        (MLX arrays are immutable: references), for a loop that must restore them."""
        self.background: Any = None
        """The learner thread (``background_learner``) or process (``learner_process``)
        while learning runs beside acting."""
        self.remote: Any = None
        """The learner process, while one learns for this agent: every recorded step and cut
        goes to its replay too, and acting takes the actors it sends back."""

    @property
    def learning(self) -> bool:
        """Whether the random warm-up is over."""
        return self.env_steps >= self.sac_cfg.learning_starts

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions (rows, action_dim) in policy units for raw observations."""
        obs = np.asarray(obs, np.float32).reshape(-1, self.obs_dim)
        if self.remote is not None:
            self.remote.receive()
        if not deterministic and not self.learning:
            squashed = self._act_rng.uniform(-1.0, 1.0, (len(obs), self.action_dim))
        else:
            squashed = self._actor(obs, None if deterministic else self._act_rng)
        return (self.low + (squashed + 1.0) * self.half_range).astype(np.float32)

    def squash(self, actions: np.ndarray) -> np.ndarray:
        """Policy-unit actions back in [-1, 1] (clipped: a guard may have moved them)."""
        scaled = (np.asarray(actions, np.float32) - self.low) / self.half_range - 1.0
        return np.clip(scaled, -1.0, 1.0)

    def record(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
               dones: np.ndarray, envs: np.ndarray | None = None,
               next_obs: np.ndarray | None = None) -> None:
        """Store one step of ``envs`` (default all; see ``ReplayBuffer.add`` for
        ``next_obs``); the observation statistics follow the states seen (replay keeps them
        raw)."""
        obs = np.asarray(obs, np.float32).reshape(-1, self.obs_dim)
        rewards_in = rewards
        rewards = np.asarray(rewards, np.float32) * self.cfg.reward_scale
        squashed = self.squash(actions).reshape(len(obs), -1)
        # numpy only: the control thread never computes in MLX (the learner merges the
        # observations into the normalizer before its next step).
        with self._replay_lock:
            self.replay.add(obs, squashed, rewards, dones, envs, next_obs)
            if self.remote is not None:
                # Its own replay and normalizer take the step as this one did.
                self.remote.send_step(obs, actions, rewards_in, dones, envs, next_obs)
            elif self.sac_cfg.normalize_observations:
                self._unmerged_obs.append(obs)
            # Steps past learning_starts each owe utd_ratio gradient steps.
            start = self.sac_cfg.learning_starts
            past_start = self.env_steps + len(obs) - max(self.env_steps, start)
            self.env_steps += len(obs)
            self.updates_owed += max(past_start, 0) * self.sac_cfg.utd_ratio

    def cut(self, envs: np.ndarray) -> None:
        """The streams of ``envs`` broke (see ``ReplayBuffer.cut``)."""
        with self._replay_lock:
            self.replay.cut(envs)
            if self.remote is not None:
                self.remote.send_cut(envs)

    @property
    def ready(self) -> bool:
        """Whether a gradient step is owed and a batch can be drawn."""
        return self.updates_owed >= 1.0 and self.replay.sampleable > 0

    def learn(self, max_steps: int | None = None) -> dict[str, float]:
        """Run the owed gradient steps (at most ``max_steps``); return mean metrics."""
        with self.model_lock:
            return self._learn(max_steps)

    def _merge_observations(self) -> None:
        with self._replay_lock:
            pending, self._unmerged_obs = self._unmerged_obs, []
        if pending:
            self.model.normalizer.update(mx.array(np.concatenate(pending)))

    def _learn(self, max_steps: int | None) -> dict[str, float]:
        self._merge_observations()
        steps = int(math.floor(self.updates_owed))
        if max_steps is not None:
            steps = min(steps, max_steps)
        if steps < 1 or self.replay.sampleable == 0:
            return {}
        start = time.perf_counter()
        totals = np.zeros(len(METRICS))
        done = 0
        for _ in range(steps):
            with self._replay_lock:
                batch = self.replay.sample(self.sac_cfg.batch_size, self._batch_rng)
            before = self.learner.snapshot()
            metrics = self.learner.step(mx.array(batch.obs), mx.array(batch.actions),
                                        mx.array(batch.rewards), mx.array(batch.next_obs),
                                        mx.array(batch.terminal))
            mx.eval(metrics, *self.learner.arrays())
            values = np.array(metrics)
            if not np.all(np.isfinite(values)):
                self.learner.restore(before)
                self.nonfinite_steps += 1
                continue
            totals += values
            done += 1
        with self._replay_lock:
            self.updates_owed -= steps
        if done == steps:
            self.good_parameters = self.model.parameters()
        self.refresh_actor()
        result = {name: float(v) for name, v in zip(METRICS, totals / max(done, 1),
                                                     strict=True)}
        result.update(gradient_steps=float(done), learn_time=time.perf_counter() - start)
        return result

    def learner_state(self) -> tuple[dict, list[dict], dict[str, float]]:
        """What learning changes, in numpy: the model's arrays and the Adam states (flat,
        by name) and the counters ``load_learner_state`` takes."""
        self._merge_observations()
        model = {k: np.array(v) for k, v in tree_flatten(self.model.parameters())}
        optimizers = [{k: np.array(v) for k, v in tree_flatten(o.state)}
                      for o in self.learner.optimizers]
        counters = {"updates_owed": self.updates_owed, "nonfinite_steps": self.nonfinite_steps,
                    "gradient_steps": self.learner.steps}
        return model, optimizers, counters

    def load_learner_state(self, model: dict, optimizer_states: list[dict],
                           counters: dict[str, float]) -> None:
        """Take a learner's state (a checkpoint's, or the learner process's): the model's
        arrays and the Adam states as trees of MLX arrays, and the counters; acting
        switches to its actor."""
        self.model.update(model)
        # In place: the compiled step holds these very dicts as its state.
        for optimizer, state in zip(self.learner.optimizers, optimizer_states, strict=True):
            optimizer.state.update(state)
        self.updates_owed = float(counters["updates_owed"])
        self.nonfinite_steps = int(counters["nonfinite_steps"])
        self.learner.steps = int(counters["gradient_steps"])
        mx.random.seed(self.cfg.seed + 1 + self.learner.steps)
        self.refresh_actor()
        mx.eval(self.learner.arrays())
        self.good_parameters = self.model.parameters()

    def refresh_actor(self) -> None:
        """Act with the model's current actor (after a learning step or a load): a new numpy
        copy, swapped in whole, so acting never sees half of one."""
        self._actor = _NumpyActor.of(self.model)
        self.actor_steps = self.learner.steps

    def act_rng_state(self) -> dict:
        return self._act_rng.bit_generator.state

    def batch_rng_state(self) -> dict:
        return self._batch_rng.bit_generator.state

    def set_rng_states(self, act: dict, batch: dict) -> None:
        self._act_rng.bit_generator.state = act
        self._batch_rng.bit_generator.state = batch

    def update(self, last_obs: np.ndarray | None = None) -> dict[str, float]:
        """A learning phase between two chunks of collection: every owed gradient step.
        ``last_obs`` (PPO's bootstrap states) is not needed: replay holds next states."""
        metrics = self.learn() if self.background is None else self.background.take()
        self.iteration += 1
        metrics["update_time"] = metrics.pop("learn_time", 0.0)
        metrics["nonfinite_steps"] = float(self.nonfinite_steps)
        return metrics

    def collector(self) -> ReplayCollector:
        """Where the training loop's steps go: the replay buffer."""
        return ReplayCollector(self)


class ReplayCollector:
    """The training loop's steps into replay; a learning phase is due every ``num_steps``
    env steps per env (all robots' steps counted together, so a stalled robot of a fleet
    does not hold the others' learning back)."""

    def __init__(self, agent: SACAgent) -> None:
        self.agent = agent
        self.num_steps = agent.cfg.num_steps
        self.filled = np.zeros(agent.num_envs, np.int64)
        """Steps of each env since the last learning phase."""
        self.bootstrap_obs = np.zeros((agent.num_envs, agent.obs_dim), np.float32)
        """Unused by replay (it keeps each step's next state); the loop hands it over."""

    @property
    def full(self) -> bool:
        return int(self.filled.sum()) >= self.num_steps * len(self.filled)

    def record(self, envs: np.ndarray, step: StepOfEnvs, next_obs: np.ndarray) -> bool:
        """Store the step of ``envs``; True when a learning phase is due."""
        self.agent.record(step.obs, step.actions, step.rewards, step.dones, envs, next_obs)
        self.filled[envs] += 1
        return self.full

    def cut(self, envs: np.ndarray) -> None:
        """The streams of ``envs`` broke: nothing waits in replay for their next state."""
        self.agent.cut(envs)

    def clear(self) -> None:
        """After a learning phase: count the next chunk."""
        self.filled[:] = 0


def sac_warm_up(cfg: AgentConfig, sac_cfg: SACConfig) -> float:
    """One gradient step of a throwaway learner of these sizes, so MLX compiles the step
    before the first action (as ``agent.warm_up_update`` does for PPO); its seconds."""
    start = time.perf_counter()
    warm = SACAgent(cfg, replace(sac_cfg, learning_starts=0, buffer_size=cfg.num_envs * 2))
    rng = np.random.default_rng(cfg.seed)
    for _ in range(2):
        obs = rng.standard_normal((cfg.num_envs, cfg.obs_dim)).astype(np.float32)
        warm.record(obs, warm.act(obs), np.zeros(cfg.num_envs), np.zeros(cfg.num_envs, np.uint8))
    warm.learn(max_steps=1)
    return time.perf_counter() - start
