"""SACConfig: the off-policy learner's settings (the ``sac.*`` parameters)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SACConfig:
    """Soft actor-critic with a squashed Gaussian policy, an ensemble of Q critics with
    Polyak-averaged targets and a learned entropy coefficient (Haarnoja et al. 2018). The
    critics can take DroQ's dropout and layer normalization (Hiraoka et al. 2022), which is
    what makes a high update-to-data ratio pay off on a robot."""

    actor_hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the policy MLP."""
    critic_hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of each Q MLP."""
    activation: str = "relu"
    """Hidden activation of every network: relu, elu, tanh or silu."""
    learning_rate: float = 3e-4
    """Adam step size of the actor, the critics and the entropy coefficient."""
    batch_size: int = 256
    """Transitions per gradient step."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions; the oldest are overwritten."""
    learning_starts: int = 5000
    """Env steps (all envs counted) acted uniformly at random before learning begins."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics (1.0: copy every step)."""
    utd_ratio: float = 1.0
    """Gradient steps per env step (update-to-data ratio; DroQ uses up to 20)."""
    init_entropy_coef: float = 1.0
    """Starting value of the learned entropy coefficient alpha."""
    target_entropy_scale: float = 1.0
    """The entropy the coefficient steers to is -this x action_dim (SAC's heuristic)."""
    n_critics: int = 2
    """Q networks in the ensemble; targets take their minimum."""
    critic_dropout: float = 0.0
    """Dropout rate in the critics (DroQ: 0.01); 0: none."""
    critic_layer_norm: bool = False
    """Layer normalization after each hidden layer of the critics (DroQ: true)."""
    normalize_observations: bool = True
    """Normalize observations with running statistics (stored raw in replay, normalized when
    sampled, so replayed data keeps its meaning)."""
    observation_clip: float = 10.0
    """Normalized observations are clipped to +-this value."""
    replay_from: str = ""
    """A replay file whose transitions seed a new run's replay (``<run>/latest.replay.
    safetensors`` of an earlier run of the same sizes, say); empty: none. A resumed run
    takes its own. Set ``learning_starts: 0`` to learn from it at once."""
    log_std_min: float = -20.0
    """Lower bound of the policy's log std (before squashing)."""
    log_std_max: float = 2.0
    """Upper bound of the policy's log std (before squashing)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.activation not in ("relu", "elu", "tanh", "silu"):
            raise ValueError(f"sac.activation '{self.activation}' unknown; choose one of "
                             "elu, relu, silu, tanh")
        for name in ("actor_hidden_dims", "critic_hidden_dims"):
            dims = getattr(self, name)
            if not dims or any(int(d) <= 0 for d in dims):
                raise ValueError(f"sac.{name} must be a non-empty list of positive widths")
        for name in ("learning_rate", "utd_ratio", "init_entropy_coef", "observation_clip"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"sac.{name} must be positive and finite, got {value}")
        for name in ("batch_size", "buffer_size", "n_critics"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"sac.{name} must be >= 1")
        if self.learning_starts < 0:
            raise ValueError("sac.learning_starts must be >= 0")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError("sac.gamma must be in [0, 1)")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError("sac.tau must be in (0, 1]")
        if not 0.0 <= self.critic_dropout < 1.0:
            raise ValueError("sac.critic_dropout must be in [0, 1)")
        if not self.log_std_min < self.log_std_max:
            raise ValueError("sac.log_std_min must be below sac.log_std_max")
