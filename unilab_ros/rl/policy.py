"""Acting with a model on numpy observations: mean or sampled actions.

Acting sits on a robot's observation -> action path, a few rows at a time. There,
MLX's fixed cost per evaluated op outweighs the arithmetic: on the 2-core Linux
machines here, sampling a 1 x 48 actor [512, 256, 128] took ~0.45 ms p50 in MLX (and
ms-long tails when the CPU is loaded), against ~0.06 ms in numpy. So, up to
``NUMPY_MAX_ROWS`` rows, the actor runs in numpy on a copy of its arrays, taken again
whenever one of them is replaced (MLX arrays are immutable: updates, rollbacks and
checkpoint loads put new arrays in the model). Larger batches, and activations numpy
does not mirror, stay in MLX.

The noise comes from numpy as well (MLX's ``split`` + ``normal`` alone cost ~0.07 ms a
step): each draw keys a Philox generator with the stream's 64-bit state, takes the
noise, then the next state. ``key`` shows that state as an MLX key array, which
checkpoints save and restore, so a resumed run continues the stream bit-exactly.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from unilab_ros.rl.model import MLPActorCritic

NUMPY_MAX_ROWS = 32
"""Largest batch acted on in numpy; above it MLX's batched matmuls win (measured here)."""

Activation = Callable[[np.ndarray], np.ndarray]

# numpy twins of unilab_ros.rl.activations; gelu (erf) has none and stays in MLX.
_NUMPY_ACTIVATIONS: dict[str, Activation] = {
    # max(x, e^x - 1) is ELU: e^x - 1 >= x everywhere, and is 0 on the positive side.
    "elu": lambda x: np.maximum(x, np.expm1(np.minimum(x, 0.0))),
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "selu": lambda x: 1.0507 * np.where(x > 0, x, 1.67326 * np.expm1(np.minimum(x, 0.0))),
    "silu": lambda x: x * (0.5 + 0.5 * np.tanh(0.5 * x)),
    "leaky_relu": lambda x: np.maximum(0.01 * x, x),
    "softplus": lambda x: np.logaddexp(x, 0.0),
}


def _actor_arrays(model: MLPActorCritic) -> tuple[mx.array, ...]:
    """The arrays the mean action and the std depend on.

    Read through the modules' dicts: attribute access on an ``nn.Module`` costs ~1 us.
    """
    normalizer = model["normalizer"]
    arrays = [normalizer["mean"], normalizer["var"], model[_std_name(model)]]
    if model.cfg.squash_output:
        arrays += (model["squash_center"], model["squash_scale"])
    for layer in model["actor"]["layers"]:
        arrays += (layer["weight"], layer["bias"])
    return tuple(arrays)


def _std_name(model: MLPActorCritic) -> str:
    return "std" if model.cfg.noise_std_type == "scalar" else "log_std"


class _NumpyActor:
    """A numpy copy of the actor: ``model.policy`` and the bounded std of the model."""

    def __init__(self, model: MLPActorCritic, arrays: tuple[mx.array, ...],
                 activation: Activation) -> None:
        self.arrays = arrays
        self.activation = activation
        obs_mean, obs_var, std_param, *layers = (np.array(a, np.float32) for a in arrays)
        cfg, normalizer = model.cfg, model.normalizer
        self.squash = None
        if cfg.squash_output:
            center, scale, *layers = layers
            self.squash = (center, scale)
        self.normalization = None
        if cfg.normalize_observations:
            scale = 1.0 / np.sqrt(obs_var + np.float32(normalizer._epsilon))
            self.normalization = (obs_mean, scale, np.float32(normalizer._clip))
        self.layers = [(np.ascontiguousarray(weight.T), bias)
                       for weight, bias in zip(layers[::2], layers[1::2], strict=True)]
        if cfg.noise_std_type == "scalar":
            std = np.clip(std_param, cfg.min_std, cfg.max_std)
        else:
            std = np.exp(np.clip(std_param, math.log(cfg.min_std), math.log(cfg.max_std)))
        self.std = std.astype(np.float32)

    def is_copy_of(self, arrays: tuple[mx.array, ...]) -> bool:
        return all(map(operator.is_, arrays, self.arrays))

    def mean(self, obs: np.ndarray) -> np.ndarray:
        x = obs
        if self.normalization is not None:
            shift, scale, clip = self.normalization
            x = np.minimum(np.maximum((x - shift) * scale, -clip), clip)
        *hidden, (weight, bias) = self.layers
        for hidden_weight, hidden_bias in hidden:
            x = self.activation(x @ hidden_weight + hidden_bias)
        mean = x @ weight + bias
        if self.squash is not None:
            center, scale = self.squash
            return center + scale * np.tanh(mean)
        return mean


class PolicySampler:
    """Actions for raw observations; its own random key makes sampling reproducible."""

    def __init__(self, model: MLPActorCritic, seed: int) -> None:
        self.model = model
        self._activation = _NUMPY_ACTIVATIONS.get(model.cfg.activation)
        self._actor: _NumpyActor | None = None
        self._bits = np.random.Philox(key=0)
        self._rng = np.random.Generator(self._bits)
        self._philox_key = np.zeros(2, np.uint64)
        zeros = np.zeros(4, np.uint64)
        self._philox_state = {
            "bit_generator": "Philox",
            "state": {"counter": zeros, "key": self._philox_key},
            "buffer": zeros,
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        self._stream = 0
        self.key = mx.random.key(seed)
        self.last_mean = np.zeros((0, model.action_dim), np.float32)
        """The mean action of the latest call (what PPO stores as the acting policy's)."""
        self.last_std = np.ones(model.action_dim, np.float32)
        self.pinned = False
        """Acting with the actor copy ``pin`` took, whatever the model holds meanwhile."""

    @property
    def key(self) -> mx.array:
        """The noise stream's state as an MLX key (uint32, shape (2,))."""
        return mx.array(np.array([self._stream & 0xFFFFFFFF, self._stream >> 32], np.uint32))

    @key.setter
    def key(self, key: mx.array) -> None:
        low, high = (int(word) for word in np.asarray(key, np.uint32).reshape(2))
        self._stream = low | high << 32

    def pin(self) -> None:
        """Act with the actor as it is now, in numpy at any batch size, until ``unpin``:
        an update running beside acting replaces the model's arrays as it goes, and the
        control thread must neither act with a half-updated policy nor evaluate MLX arrays
        the update thread is computing."""
        self.check_pinnable()
        self._copy_actor()
        self.pinned = True

    def check_pinnable(self) -> None:
        """Refuse an actor ``pin`` cannot copy to numpy (its activation has no twin)."""
        if self._activation is None:
            raise ValueError(f"the {self.model.cfg.activation} activation has no numpy twin: "
                             "acting beside an update needs one of "
                             f"{sorted(_NUMPY_ACTIVATIONS)}")

    def unpin(self) -> None:
        """The update is done: the next action copies the model's new actor."""
        self.pinned = False

    def _copy_actor(self) -> None:
        arrays = _actor_arrays(self.model)
        if self._actor is None or not self._actor.is_copy_of(arrays):
            self._actor = _NumpyActor(self.model, arrays, self._activation)

    def __call__(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        obs = np.asarray(obs, np.float32)
        if not self.pinned:
            if self._activation is None or obs.size > NUMPY_MAX_ROWS * self.model.obs_dim:
                return self._mlx_actions(obs, deterministic)
            self._copy_actor()
        mean = self._actor.mean(obs)
        self.last_mean, self.last_std = mean, self._actor.std
        if deterministic:
            return mean
        return mean + self._actor.std * self._noise(mean.shape)

    def _mlx_actions(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        mean = self.model.policy(mx.array(obs))
        std, _ = self.model.std_and_log_std()
        self.last_mean, self.last_std = np.array(mean), np.array(std)
        if deterministic:
            return self.last_mean
        return np.array(mean + std * mx.array(self._noise(tuple(mean.shape))))

    def _noise(self, shape: tuple[int, ...]) -> np.ndarray:
        """Standard normal float32 noise from the stream, which it advances."""
        self._philox_key[0] = self._stream
        self._bits.state = self._philox_state
        noise = self._rng.standard_normal(shape, dtype=np.float32)
        self._stream = self._bits.random_raw()
        return noise
