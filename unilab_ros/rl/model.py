"""MLPActorCritic: a diagonal-Gaussian policy and a value function as separate MLPs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from unilab_ros.rl import activations
from unilab_ros.rl.normalizer import RunningNormalizer

NOISE_STD_TYPES = ("scalar", "log")


@dataclass
class ModelConfig:
    """Actor-critic architecture."""

    actor_hidden_dims: list[int] = field(default_factory=lambda: [256, 256, 256])
    """Hidden layer widths of the policy MLP."""
    critic_hidden_dims: list[int] = field(default_factory=lambda: [256, 256, 256])
    """Hidden layer widths of the value MLP."""
    activation: str = "elu"
    """Hidden activation: one of elu, relu, tanh, selu, gelu, silu, leaky_relu, softplus."""
    init_noise_std: float = 1.0
    """Initial standard deviation of the Gaussian policy (state-independent)."""
    noise_std_type: str = "scalar"
    """"scalar": the std itself is learned; "log": its logarithm is learned."""
    min_std: float = 1e-3
    """Lower bound on the policy std (keeps log-probs finite; set higher, e.g. 0.2, a floor
    on exploration): the learned std is clipped to it wherever the std is used (acting,
    the loss, a deployed bundle). The clip passes no gradient at or below the floor, so a
    std that reaches it stays there for the rest of the run. Under ``noise_std_type: log``
    it holds to float32 rounding (exp(log(min_std)) may come out one ulp under)."""
    max_std: float = 10.0
    """Upper bound on the policy std."""
    normalize_observations: bool = True
    """Normalize observations with running statistics stored in the model."""
    observation_clip: float = 10.0
    """Normalized observations are clipped to +-this value; so are, once the normalizer
    has seen 1,000 samples, those that update its statistics (a sensor glitch then
    barely moves them)."""
    squash_output: bool = False
    """The mean action is squashed by tanh onto a box: ``squash_center + squash_scale *
    tanh(mean)``, two arrays of the model. That is the off-policy learner's actor as a
    bundle deploys it; PPO trains a linear mean and refuses it."""
    normalizer_keeps_outputs: bool = False
    """When an input's spread narrows (its std falls at an update), fold the change of its
    statistics into the first layer of the actor and of the critic (weights x s'/s, bias
    + W (m' - m)/s): along it both compute the same function of the raw observation as
    before (exactly, inside the clip). Without it the new statistics move the policy
    outside the update's KL stop and ratio clip, every update in the same direction: late
    in a run the observations narrow as the policy gets good, the normalized inputs grow,
    and so do the gains of a near-deterministic policy (InvertedDoublePendulum's std
    reaches 0.01-0.03) until it overshoots. An input whose spread grew is left to the
    statistics (it is divided by more: the policy gets less sensitive to it), since
    folding that keeps the gain of an input that was nearly constant at first (Ant's
    contact forces) and leaves the policy hypersensitive to it. The first statistics are
    never folded: they replace the placeholder (mean 0, std 1) and set the inputs' scale."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.activation not in activations.ACTIVATIONS:
            raise ValueError(
                f"activation '{self.activation}' unknown; "
                f"choose one of {sorted(activations.ACTIVATIONS)}"
            )
        if self.noise_std_type not in NOISE_STD_TYPES:
            raise ValueError(f"noise_std_type must be one of {NOISE_STD_TYPES}")
        for name in ("actor_hidden_dims", "critic_hidden_dims"):
            dims = getattr(self, name)
            if not dims or any(int(d) <= 0 for d in dims):
                raise ValueError(f"{name} must be a non-empty list of positive widths")
        if not 0.0 < self.min_std <= self.init_noise_std <= self.max_std:
            raise ValueError("need 0 < min_std <= init_noise_std <= max_std")
        if self.observation_clip <= 0.0:
            raise ValueError("observation_clip must be positive")


class MLP(nn.Module):
    """Linear layers with an activation between them, orthogonally initialised."""

    def __init__(
        self,
        in_dim: int,
        hidden: list[int],
        out_dim: int,
        activation: Callable[[mx.array], mx.array],
        out_gain: float,
    ) -> None:
        super().__init__()
        dims = [in_dim, *[int(h) for h in hidden], out_dim]
        self.layers = [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        self._activation = activation
        hidden_init = nn.init.orthogonal(gain=math.sqrt(2.0))
        out_init = nn.init.orthogonal(gain=out_gain)
        for i, layer in enumerate(self.layers):
            init = out_init if i == len(self.layers) - 1 else hidden_init
            layer.weight = init(layer.weight)
            layer.bias = mx.zeros_like(layer.bias)

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers[:-1]:
            x = self._activation(layer(x))
        return self.layers[-1](x)


class MLPActorCritic(nn.Module):
    """Gaussian policy with a state-independent std, and a separate value MLP."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or ModelConfig()
        cfg.validate()
        self.cfg = cfg
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        activation = activations.ACTIVATIONS[cfg.activation]
        # Outside any transform, so a failing JIT shows here and falls back.
        activations.prepare(cfg.activation)
        self.actor = MLP(obs_dim, cfg.actor_hidden_dims, action_dim, activation, 0.01)
        self.critic = MLP(obs_dim, cfg.critic_hidden_dims, 1, activation, 1.0)
        if cfg.noise_std_type == "scalar":
            self.std = mx.full((action_dim,), cfg.init_noise_std)
        else:
            self.log_std = mx.full((action_dim,), math.log(cfg.init_noise_std))
        self.normalizer = RunningNormalizer(obs_dim, clip=cfg.observation_clip)
        if cfg.squash_output:
            self.squash_center = mx.zeros((action_dim,))
            self.squash_scale = mx.ones((action_dim,))
            self.freeze(keys=["squash_center", "squash_scale"], recurse=False)
        self._log_min_std = math.log(cfg.min_std)
        self._log_max_std = math.log(cfg.max_std)

    def normalize(self, obs: mx.array) -> mx.array:
        return self.normalizer(obs) if self.cfg.normalize_observations else obs

    def update_normalizer(self, obs: mx.array) -> float:
        """Merge ``obs`` into the observation statistics; return the mean KL by which the
        change moved the policy on ``obs`` (under ``normalizer_keeps_outputs``, what was
        left unfolded)."""
        before_mean, before_std = self.normalizer.mean, self.normalizer.std
        first = float(self.normalizer.count.item()) == 0.0
        actions_before = self.policy(obs)
        self.normalizer.update(obs)
        if self.cfg.normalizer_keeps_outputs and not first:
            # (x - m) / s  =  (m' - m) / s  +  (s' / s) (x - m') / s', for the inputs whose
            # spread narrowed; the others stay unfolded (scale 1, no shift).
            narrowed = self.normalizer.std <= before_std
            scale = mx.where(narrowed, self.normalizer.std / before_std, 1.0)
            shift = mx.where(narrowed, (self.normalizer.mean - before_mean) / before_std, 0.0)
            for mlp in (self.actor, self.critic):
                layer = mlp.layers[0]
                layer.bias = layer.bias + layer.weight @ shift
                layer.weight = layer.weight * scale
            mx.eval(self.actor.parameters(), self.critic.parameters())
        std, _ = self.std_and_log_std()
        # The std does not depend on the input, so the KL is the mean's shift alone.
        shift_kl = mx.sum(mx.square((self.policy(obs) - actions_before) / std), axis=-1)
        return float(mx.mean(shift_kl).item()) / 2.0

    def std_and_log_std(self) -> tuple[mx.array, mx.array]:
        """The bounded policy std and its log, shape (action_dim,)."""
        if self.cfg.noise_std_type == "scalar":
            std = mx.clip(self.std, self.cfg.min_std, self.cfg.max_std)
            return std, mx.log(std)
        log_std = mx.clip(self.log_std, self._log_min_std, self._log_max_std)
        return mx.exp(log_std), log_std

    def distribution_params(self, obs: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(mean, std, log_std), each shaped like the actions."""
        mean = self.actor(self.normalize(obs))
        std, log_std = self.std_and_log_std()
        return mean, mx.broadcast_to(std, mean.shape), mx.broadcast_to(log_std, mean.shape)

    def value(self, obs: mx.array) -> mx.array:
        """State values, shape (batch,)."""
        return self.critic(self.normalize(obs)).squeeze(-1)

    def policy(self, obs: mx.array) -> mx.array:
        """Deterministic (mean) actions, for evaluation and deployment."""
        mean = self.actor(self.normalize(obs))
        if self.cfg.squash_output:
            return self.squash_center + self.squash_scale * mx.tanh(mean)
        return mean
