"""The soft actor-critic's networks and its gradient step, on MLX.

Actions live in [-1, 1]: the policy is a Gaussian squashed by tanh, whose log-density
carries the change of variables, log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
(the stable form). Mapping [-1, 1] to the robot's limits is the agent's business.

One gradient step, as Stable-Baselines3's SAC orders it: the critics regress on
r + gamma (1 - terminal) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' drawn from the
current policy; the actor then minimizes alpha log pi(a|s) - min_i Q_i(s, a) through the
updated critics; alpha follows -log_alpha (log pi + target entropy); the target critics
move by ``tau``. The whole step is compiled once (fixed batch shape).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map

from unilab_ros.rl.normalizer import RunningNormalizer
from unilab_ros.rl.sac_config import SACConfig

_LOG = logging.getLogger(__name__)
_LOG2 = math.log(2.0)

HIDDEN_ACTIVATIONS = {"relu": nn.relu, "elu": nn.elu, "tanh": mx.tanh, "silu": nn.silu}


def _dense(dims: list[int]) -> list[nn.Linear]:
    return [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)]


class SquashedGaussianActor(nn.Module):
    """mean and log std of a Gaussian over pre-squash actions, from normalized states."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: SACConfig) -> None:
        super().__init__()
        self.layers = _dense([obs_dim, *map(int, cfg.actor_hidden_dims), 2 * action_dim])
        self._activation = HIDDEN_ACTIVATIONS[cfg.activation]
        self._log_std_min, self._log_std_max = cfg.log_std_min, cfg.log_std_max

    def __call__(self, obs: mx.array) -> tuple[mx.array, mx.array]:
        x = obs
        for layer in self.layers[:-1]:
            x = self._activation(layer(x))
        mean, log_std = mx.split(self.layers[-1](x), 2, axis=-1)
        return mean, mx.clip(log_std, self._log_std_min, self._log_std_max)

    def sample(self, obs: mx.array) -> tuple[mx.array, mx.array]:
        """Squashed actions drawn from the policy and their log-densities (batch,)."""
        mean, log_std = self(obs)
        noise = mx.random.normal(mean.shape)
        pre = mean + mx.exp(log_std) * noise
        log_prob = mx.sum(-0.5 * noise * noise - log_std - 0.5 * math.log(2.0 * math.pi)
                          - 2.0 * (_LOG2 - pre - nn.softplus(-2.0 * pre)), axis=-1)
        return mx.tanh(pre), log_prob


class QNetwork(nn.Module):
    """Q(s, a) from a normalized state and a squashed action; DroQ's dropout and layer
    normalization after each hidden layer when configured."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: SACConfig) -> None:
        super().__init__()
        widths = [obs_dim + action_dim, *map(int, cfg.critic_hidden_dims), 1]
        self.layers = _dense(widths)
        self.norms = [nn.LayerNorm(w) for w in widths[1:-1]] if cfg.critic_layer_norm else []
        self.dropout = nn.Dropout(cfg.critic_dropout) if cfg.critic_dropout > 0 else None
        self._activation = HIDDEN_ACTIVATIONS[cfg.activation]

    def __call__(self, obs: mx.array, actions: mx.array) -> mx.array:
        x = mx.concatenate([obs, actions], axis=-1)
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x)
            if self.dropout is not None:
                x = self.dropout(x)
            if self.norms:
                x = self.norms[i](x)
            x = self._activation(x)
        return self.layers[-1](x).squeeze(-1)


class Critics(nn.Module):
    """An ensemble of Q networks."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: SACConfig) -> None:
        super().__init__()
        self.members = [QNetwork(obs_dim, action_dim, cfg) for _ in range(cfg.n_critics)]

    def __call__(self, obs: mx.array, actions: mx.array) -> mx.array:
        """Q values, shape (n_critics, batch)."""
        return mx.stack([q(obs, actions) for q in self.members])


class SACModel(nn.Module):
    """Everything the learner trains or tracks: the normalizer the networks share, the actor,
    the critics, their targets and the entropy coefficient's log."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: SACConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.normalizer = RunningNormalizer(obs_dim, clip=cfg.observation_clip)
        self.actor = SquashedGaussianActor(obs_dim, action_dim, cfg)
        self.critics = Critics(obs_dim, action_dim, cfg)
        self.targets = Critics(obs_dim, action_dim, cfg)
        self.targets.update(self.critics.parameters())
        self.targets.freeze()
        self.log_alpha = mx.array([math.log(cfg.init_entropy_coef)])

    def normalize(self, obs: mx.array) -> mx.array:
        return self.normalizer(obs) if self.cfg.normalize_observations else obs

    def policy(self, obs: mx.array) -> mx.array:
        """Deterministic squashed actions (tanh of the mean) for raw observations."""
        mean, _ = self.actor(self.normalize(obs))
        return mx.tanh(mean)


class SACLearner:
    """Owns the optimizers and the compiled gradient step of one ``SACModel``."""

    def __init__(self, model: SACModel, seed: int) -> None:
        self.model = model
        cfg = model.cfg
        self.target_entropy = -cfg.target_entropy_scale * model.action_dim
        self.optimizers = [optim.Adam(learning_rate=cfg.learning_rate, bias_correction=True)
                           for _ in range(3)]
        self.optimizers[0].init(model.critics.trainable_parameters())
        self.optimizers[1].init(model.actor.trainable_parameters())
        self.optimizers[2].init({"log_alpha": model.log_alpha})
        mx.random.seed(seed)
        self.random_state = mx.random.state
        self._critic_grad = nn.value_and_grad(model.critics, self._critic_loss)
        self._actor_grad = nn.value_and_grad(model.actor, self._actor_loss)
        self._alpha_grad = mx.value_and_grad(self._alpha_loss)
        state = self._state()
        self._step = mx.compile(self._train_step, inputs=state, outputs=state)
        self.steps = 0
        """Gradient steps taken (restored from checkpoints)."""

    def _state(self) -> list[Any]:
        return [self.model.state, *(o.state for o in self.optimizers), self.random_state]

    def _critic_loss(self, obs: mx.array, actions: mx.array, target: mx.array) -> mx.array:
        q = self.model.critics(obs, actions)
        return 0.5 * mx.sum(mx.mean(mx.square(q - target), axis=-1))

    def _actor_loss(self, obs: mx.array, alpha: mx.array) -> tuple[mx.array, mx.array]:
        actions, log_prob = self.model.actor.sample(obs)
        q = mx.min(self.model.critics(obs, actions), axis=0)
        return mx.mean(alpha * log_prob - q), log_prob

    def _alpha_loss(self, log_alpha: mx.array, log_prob: mx.array) -> mx.array:
        return -mx.mean(log_alpha * (log_prob + self.target_entropy))

    def _train_step(self, obs: mx.array, actions: mx.array, rewards: mx.array,
                    next_obs: mx.array, terminal: mx.array) -> mx.array:
        model, cfg = self.model, self.model.cfg
        obs, next_obs = model.normalize(obs), model.normalize(next_obs)
        alpha = mx.exp(model.log_alpha)
        next_actions, next_log_prob = model.actor.sample(next_obs)
        next_q = mx.min(model.targets(next_obs, next_actions), axis=0) - alpha * next_log_prob
        target = mx.stop_gradient(rewards + cfg.gamma * (1.0 - terminal) * next_q)
        critic_loss, grads = self._critic_grad(obs, actions, target)
        self.optimizers[0].update(model.critics, grads)
        (actor_loss, log_prob), grads = self._actor_grad(obs, mx.stop_gradient(alpha))
        self.optimizers[1].update(model.actor, grads)
        alpha_loss, grad = self._alpha_grad(model.log_alpha, mx.stop_gradient(log_prob))
        model.log_alpha = self.optimizers[2].apply_gradients(
            {"log_alpha": grad}, {"log_alpha": model.log_alpha})["log_alpha"]
        model.targets.update(tree_map(lambda t, s: (1.0 - cfg.tau) * t + cfg.tau * s,
                                      model.targets.parameters(), model.critics.parameters()))
        entropy = -mx.mean(log_prob)
        return mx.stack([critic_loss, actor_loss, alpha_loss, alpha[0], entropy])

    def step(self, obs: mx.array, actions: mx.array, rewards: mx.array, next_obs: mx.array,
             terminal: mx.array) -> mx.array:
        """One gradient step on a batch; returns the (unevaluated) metrics vector: critic
        loss, actor loss, alpha loss, alpha, policy entropy."""
        self.steps += 1
        return self._step(obs, actions, rewards, next_obs, terminal)

    def arrays(self) -> list[mx.array]:
        """Every array a step changes, for ``mx.eval`` and for snapshots."""
        return [leaf for _, leaf in tree_flatten(self._state())]

    def snapshot(self) -> list[Any]:
        """The parameters and optimizer states to roll back to (MLX arrays are immutable:
        references suffice). The random stream goes on: a rolled-back step's draws are
        simply not reused."""
        return [tree_map(lambda x: x, part) for part in self._state()[:-1]]

    def restore(self, snapshot: list[Any]) -> None:
        model_state, *optimizer_states = snapshot
        self.model.update(model_state)
        # In place: the compiled step holds these very dicts as its state.
        for optimizer, state in zip(self.optimizers, optimizer_states, strict=True):
            optimizer.state.update(state)
