"""Diagonal-Gaussian log-probability, entropy and KL divergence."""

from __future__ import annotations

import math

import mlx.core as mx

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def diag_gaussian_log_prob(actions: mx.array, mean: mx.array, log_std: mx.array) -> mx.array:
    """Log-density of ``actions`` summed over the last axis."""
    z = (actions - mean) * mx.exp(-log_std)
    return mx.sum(-0.5 * z * z - log_std - _LOG_SQRT_2PI, axis=-1)


def diag_gaussian_entropy(log_std: mx.array) -> mx.array:
    """Entropy summed over the last axis."""
    return mx.sum(0.5 + _LOG_SQRT_2PI + log_std, axis=-1)


def diag_gaussian_kl(
    old_mean: mx.array, old_std: mx.array, mean: mx.array, std: mx.array
) -> mx.array:
    """KL(old || new) summed over the last axis, exact for any std above 1e-8.

    rsl_rl's guard, log(std / (old_std + 1e-5) + 1e-5), read KLs low by ~1e-5 / std per
    dim: 10% of a 0.01 target at the small stds of a converged policy. The floor here
    only keeps a zero std (an unfilled row) finite.
    """
    return mx.sum(
        mx.log(std / mx.maximum(old_std, 1e-8))
        + (old_std * old_std + (old_mean - mean) ** 2) / (2.0 * std * std)
        - 0.5,
        axis=-1,
    )
