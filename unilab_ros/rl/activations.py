"""Hidden-layer activations by name."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "elu": nn.elu,
    "relu": nn.relu,
    "tanh": mx.tanh,
    "selu": nn.selu,
    "gelu": nn.gelu,
    "silu": nn.silu,
    "leaky_relu": nn.leaky_relu,
    "softplus": nn.softplus,
}
