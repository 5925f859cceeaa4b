"""The native ELU kernels (unilab_ros.rl.native) and the fallback to plain MLX ops."""

from __future__ import annotations

import math
import sys

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl import activations, native
from unilab_ros.rl.agent import AgentConfig, PPOAgent, warm_up_update
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo import PPOConfig

needs_native = pytest.mark.skipif(
    activations._native is None, reason=f"native kernels: {activations.NATIVE_STATUS}"
)


def inputs() -> np.ndarray:
    """Negative floats down to the -1 plateau, zeros, positives, in a 2-D batch."""
    values = np.concatenate([-np.geomspace(1e-30, 100.0, 3000), [0.0, -0.0],
                             np.linspace(0.0, 50.0, 998)])
    return values.astype(np.float32).reshape(40, 100)


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype(np.float64)
    return np.where(x64 > 0, x64, np.expm1(x64)), np.where(x64 > 0, 1.0, np.exp(x64))


@needs_native
def test_native_elu_value_and_gradient_against_float64() -> None:
    x = inputs()
    weights = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    value, slope = reference(x)
    y = activations._native.elu(mx.array(x))
    np.testing.assert_allclose(np.array(y), value, rtol=1e-7, atol=5e-8)
    grad = mx.grad(lambda v: mx.sum(activations._native.elu(v) * mx.array(weights)))(
        mx.array(x)
    )
    np.testing.assert_allclose(np.array(grad), slope * weights, rtol=2e-7, atol=6e-8)


@needs_native
def test_native_and_plain_mlx_elu_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    x = mx.array(inputs())
    native_y, native_grad = mx.value_and_grad(lambda v: mx.sum(activations.elu(v)))(x)
    monkeypatch.setattr(activations, "_native", None)
    plain_y, plain_grad = mx.value_and_grad(lambda v: mx.sum(activations.elu(v)))(x)
    assert abs(native_y.item() - plain_y.item()) <= 1e-6 * abs(plain_y.item())
    np.testing.assert_allclose(np.array(native_grad), np.array(plain_grad), atol=6e-8)


@needs_native
def test_strided_inputs_compiled_steps_and_special_values() -> None:
    elu = activations._native.elu
    x = mx.array(inputs())
    # A transposed view and a broadcast cotangent take the strided path.
    np.testing.assert_allclose(np.array(elu(x.T)), reference(inputs().T)[0], atol=5e-8)
    grad = mx.grad(lambda v: mx.sum(elu(v.T)))(x)
    np.testing.assert_allclose(np.array(grad), reference(inputs())[1], atol=6e-8)
    compiled = mx.compile(mx.value_and_grad(lambda v: mx.sum(elu(v) * 2.0)))
    value, grad = compiled(x)
    np.testing.assert_allclose(np.array(grad), 2.0 * reference(inputs())[1], atol=2e-7)
    special = np.array(elu(mx.array([float("nan"), float("inf"), -float("inf"), -1e30])))
    assert np.isnan(special[0])
    np.testing.assert_array_equal(special[1:], [math.inf, -1.0, -1.0])


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    module, status = native.load()
    assert module is None and native.DISABLE_ENV in status


def test_a_module_built_for_another_mlx_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    if activations._native is None:
        pytest.skip(f"native kernels: {activations.NATIVE_STATUS}")
    monkeypatch.setattr(activations._native, "mlx_version", "0.0.1")
    module, status = native.load()
    assert module is None and "rebuild" in status


def test_no_build_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert "only built on Linux" in (native.build_skip_reason() or "")


def test_without_the_module_the_model_uses_plain_mlx_ops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(activations, "_native", None)
    x = mx.array(inputs())
    np.testing.assert_allclose(np.array(activations.elu(x)), reference(inputs())[0], atol=6e-8)
    assert activations.prepare_elu() is None


def test_warm_up_update_leaves_training_unchanged() -> None:
    cfg = AgentConfig(num_envs=4, obs_dim=3, action_dim=2, num_steps=8, seed=3)
    model_cfg = ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16])
    ppo_cfg = PPOConfig(num_learning_epochs=1, num_mini_batches=2)
    assert warm_up_update(cfg, model_cfg, ppo_cfg) > 0.0
    after = PPOAgent(cfg, model_cfg, ppo_cfg)
    fresh = PPOAgent(cfg, model_cfg, ppo_cfg)
    obs = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(after.act(obs), fresh.act(obs))
