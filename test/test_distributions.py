"""Diagonal-Gaussian log-prob, entropy and KL against closed forms written with math."""

import math

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl.distributions import (
    diag_gaussian_entropy,
    diag_gaussian_kl,
    diag_gaussian_log_prob,
)

RNG = np.random.default_rng(0)
BATCH, DIM = 6, 3
MEAN = RNG.normal(size=(BATCH, DIM)).astype(np.float32)
STD = RNG.uniform(0.2, 2.0, size=(BATCH, DIM)).astype(np.float32)
ACTIONS = (MEAN + STD * RNG.normal(size=(BATCH, DIM))).astype(np.float32)


def gaussian_density(x: float, mean: float, std: float) -> float:
    return math.exp(-((x - mean) ** 2) / (2.0 * std * std)) / (std * math.sqrt(2.0 * math.pi))


def test_log_prob_is_log_of_the_product_of_densities():
    log_probs = np.array(diag_gaussian_log_prob(mx.array(ACTIONS), mx.array(MEAN), mx.log(STD)))
    assert log_probs.shape == (BATCH,)
    for row in range(BATCH):
        density = math.prod(
            gaussian_density(float(a), float(m), float(s))
            for a, m, s in zip(ACTIONS[row], MEAN[row], STD[row], strict=True)
        )
        assert log_probs[row] == pytest.approx(math.log(density), rel=1e-5, abs=1e-5)


def test_log_prob_peaks_at_the_mean():
    log_std = mx.log(mx.array(STD))
    at_mean = np.array(diag_gaussian_log_prob(mx.array(MEAN), mx.array(MEAN), log_std))
    elsewhere = np.array(diag_gaussian_log_prob(mx.array(ACTIONS), mx.array(MEAN), log_std))
    assert np.all(at_mean >= elsewhere)


def test_entropy_closed_form():
    entropy = np.array(diag_gaussian_entropy(mx.log(mx.array(STD))))
    expected = [
        sum(0.5 * math.log(2.0 * math.pi * math.e * float(s) ** 2) for s in row) for row in STD
    ]
    np.testing.assert_allclose(entropy, expected, rtol=1e-5, atol=1e-5)


def test_entropy_is_the_expected_negative_log_prob():
    # Ties the two functions together: H = E[-log p(a)] for a drawn from p.
    mean, std = np.array([0.3, -1.0], np.float32), np.array([0.5, 2.0], np.float32)
    samples = mean + std * np.random.default_rng(1).normal(size=(200_000, 2)).astype(np.float32)
    log_std = mx.log(mx.array(std))
    log_probs = diag_gaussian_log_prob(mx.array(samples), mx.array(mean), log_std)
    estimate = -float(mx.mean(log_probs).item())
    assert estimate == pytest.approx(float(diag_gaussian_entropy(log_std).item()), abs=0.01)


def test_kl_closed_form():
    old_mean, old_std = MEAN, STD
    new_mean = (MEAN + RNG.normal(size=MEAN.shape)).astype(np.float32)
    new_std = RNG.uniform(0.2, 2.0, size=STD.shape).astype(np.float32)
    kl = np.array(
        diag_gaussian_kl(
            mx.array(old_mean), mx.array(old_std), mx.array(new_mean), mx.array(new_std)
        )
    )
    expected = [
        sum(
            math.log(s1 / s0) + (s0 * s0 + (m0 - m1) ** 2) / (2.0 * s1 * s1) - 0.5
            for m0, s0, m1, s1 in zip(
                old_mean[row].tolist(),
                old_std[row].tolist(),
                new_mean[row].tolist(),
                new_std[row].tolist(),
                strict=True,
            )
        )
        for row in range(BATCH)
    ]
    np.testing.assert_allclose(kl, expected, rtol=1e-4, atol=1e-6)
    assert np.all(kl > 0.0)


def test_kl_of_a_distribution_with_itself_is_zero():
    kl = np.array(diag_gaussian_kl(mx.array(MEAN), mx.array(STD), mx.array(MEAN), mx.array(STD)))
    np.testing.assert_allclose(kl, np.zeros(BATCH), atol=1e-6)


def test_kl_is_finite_for_a_zero_old_std():
    kl = diag_gaussian_kl(mx.zeros((1, 2)), mx.zeros((1, 2)), mx.ones((1, 2)), mx.ones((1, 2)))
    assert np.all(np.isfinite(np.array(kl)))
