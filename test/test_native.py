"""The native ELU, tanh and SiLU kernels (unilab_ros.rl.native) and the fallback to plain
MLX ops."""

from __future__ import annotations

import logging
import math
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.rl import activations, native
from unilab_ros.rl.agent import AgentConfig, PPOAgent, warm_up_update
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig

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


SMOOTH = ("tanh", "silu")


def wide_inputs() -> np.ndarray:
    """Both signs from subnormal to near float32's largest, dense where the activations
    bend, and zeros, in a 2-D batch (the non-finite inputs have their own test)."""
    magnitudes = np.geomspace(1e-44, 3e38, 1500)
    values = np.concatenate([-magnitudes, magnitudes, np.linspace(-20.0, 20.0, 998), [0, -0.0]])
    return values.astype(np.float32).reshape(40, 100)


def smooth_reference(name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value and slope in float64, for finite x."""
    x64 = x.astype(np.float64)
    if name == "tanh":
        y = np.tanh(x64)
        return y, 1.0 - y * y
    t = np.exp(-np.abs(x64))
    sigmoid = np.where(x64 >= 0, 1.0 / (1.0 + t), t / (1.0 + t))
    return x64 * sigmoid, sigmoid * (1.0 + x64 * (1.0 - sigmoid))


# (rtol, atol) of the value, then of the slope. The maxima measured over wide_inputs()
# and 5M further float32 (random bit patterns, a fine grid on [-30, 30]), in the AVX2 +
# FMA and the baseline builds alike:
# tanh: value 1.7e-7 relative (2.5 ulp); slope 3e-7 absolute: it is 1 - y**2 from the
# float32 output y, so where it is small (|x| > 4) it is only good relative to 1.
# silu: value 2.3e-7 relative (3.4 ulp), and 0 for x < -87, whose true value is below
# 1.5e-36; slope 2.2e-7 absolute (within 2 ulp of 1), relative only away from its zero
# at x = -1.278.
TOLERANCES = {
    "tanh": ((2e-7, 1e-45), (0.0, 3e-7)),
    "silu": ((2.5e-7, 1.5e-36), (2e-7, 1.2e-7)),
}


@needs_native
@pytest.mark.parametrize("name", SMOOTH)
def test_native_tanh_and_silu_value_and_gradient_against_float64(name: str) -> None:
    function = getattr(activations._native, name)
    x = wide_inputs()
    # Powers of two: multiplying by them is exact, so grad / weights is the slope itself.
    exponents = np.random.default_rng(0).integers(-3, 4, x.shape)
    weights = (np.random.default_rng(1).choice([-1.0, 1.0], x.shape) * 2.0**exponents)
    weights = weights.astype(np.float32)
    value, slope = smooth_reference(name, x)
    (value_tol, slope_tol) = TOLERANCES[name]
    y = function(mx.array(x))
    np.testing.assert_allclose(np.array(y), value, *value_tol)
    grad = mx.grad(lambda v: mx.sum(function(v) * mx.array(weights)))(mx.array(x))
    np.testing.assert_allclose(np.array(grad) / weights, slope, *slope_tol)


@needs_native
@pytest.mark.parametrize(
    ("name", "value", "slope"),
    [
        ("tanh", [math.nan, 1.0, -1.0, 1.0, -1.0, -1.0], [math.nan, 0.0, 0.0, 0.0, 0.0, 0.0]),
        # silu(-inf) is 0, not -inf * sigmoid(-inf) = -inf * 0 = NaN.
        ("silu", [math.nan, math.inf, 0.0, 3e38, 0.0, 0.0], [math.nan, 1.0, 0.0, 1.0, 0.0, 0.0]),
    ],
)
def test_native_tanh_and_silu_special_values(
    name: str, value: list[float], slope: list[float]
) -> None:
    function = getattr(activations._native, name)
    # NaN propagates (the trainer's finite checks rely on it), the rest saturate.
    x = mx.array([math.nan, math.inf, -math.inf, 3e38, -3e38, -100.0])
    y, grad = function(x), mx.grad(lambda v: mx.sum(function(v)))(x)
    np.testing.assert_array_equal(np.array(y), np.array(value, np.float32))
    np.testing.assert_array_equal(np.array(grad), slope)


@needs_native
@pytest.mark.parametrize("name", SMOOTH)
def test_native_tanh_and_silu_strided_compiled_and_transformed(name: str) -> None:
    function = getattr(activations._native, name)
    (value_tol, slope_tol) = TOLERANCES[name]
    x = mx.array(wide_inputs())
    value, slope = smooth_reference(name, wide_inputs())
    # A sliced view takes the strided forward; the broadcast cotangent of a sum over a
    # transposed view the strided backward.
    np.testing.assert_allclose(np.array(function(x[:, ::3])), value[:, ::3], *value_tol)
    grad = mx.grad(lambda v: mx.sum(function(v.T)))(x)
    np.testing.assert_allclose(np.array(grad), slope, *slope_tol)
    compiled = mx.compile(mx.value_and_grad(lambda v: mx.sum(function(v) * 2.0)))
    np.testing.assert_allclose(np.array(compiled(x)[1]) / 2.0, slope, *slope_tol)
    _, tangent = mx.jvp(function, [x], [mx.ones_like(x)])
    np.testing.assert_allclose(np.array(tangent[0]), slope, *slope_tol)
    np.testing.assert_array_equal(np.array(mx.vmap(function)(x)), np.array(function(x)))


@needs_native
@pytest.mark.parametrize("name", SMOOTH)
def test_native_tanh_and_silu_second_derivative(name: str) -> None:
    # Differentiating the backward primitive goes through MLX ops.
    function = getattr(activations._native, name)
    x64 = np.linspace(-8.0, 8.0, 801)
    x = mx.array(x64.astype(np.float32))
    second = mx.grad(lambda v: mx.sum(mx.grad(lambda u: mx.sum(function(u)))(v)))(x)
    if name == "tanh":
        y = np.tanh(x64)
        expected = -2.0 * y * (1.0 - y * y)
    else:
        s = 1.0 / (1.0 + np.exp(-x64))
        expected = s * (1.0 - s) * (2.0 + x64 * (1.0 - 2.0 * s))
    np.testing.assert_allclose(np.array(second), expected, atol=1e-6)


@pytest.mark.parametrize("name", SMOOTH)
def test_a_model_runs_tanh_and_silu_natively_unless_disabled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    if activations._native is None:
        pytest.skip(f"native kernels: {activations.NATIVE_STATUS}")
    calls = []

    class Recorder:
        def __getattr__(self, attr: str) -> object:
            calls.append(attr)
            return getattr(real, attr)

    real = activations._native
    monkeypatch.setattr(activations, "_native", Recorder())
    cfg = ModelConfig(actor_hidden_dims=[32, 32], critic_hidden_dims=[32], activation=name)
    with caplog.at_level(logging.INFO, logger=activations.__name__):
        model = MLPActorCritic(5, 2, cfg)
    assert f"{name}: {activations.NATIVE_STATUS}" in caplog.messages
    obs = mx.array(np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32) * 3)

    def loss(m: MLPActorCritic) -> mx.array:
        return mx.sum(m.policy(obs) ** 2) + mx.sum(m.value(obs))

    native_loss, native_grads = nn.value_and_grad(model, loss)(model)
    assert name in calls
    # What UNILAB_NATIVE=0 gives at import: no module, so mx.tanh / nn.silu.
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    monkeypatch.setattr(activations, "_native", native.load()[0])
    assert activations._native is None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=activations.__name__):
        MLPActorCritic(5, 2, cfg)
    assert caplog.messages == [f"{name}: MLX ops (native kernels: {activations.NATIVE_STATUS})"]
    plain_loss, plain_grads = nn.value_and_grad(model, loss)(model)
    assert abs(native_loss.item() - plain_loss.item()) <= 1e-5 * abs(plain_loss.item())
    pairs = zip(tree_flatten(native_grads), tree_flatten(plain_grads), strict=True)
    for (key, a), (_, b) in pairs:
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-6, err_msg=key)


@needs_native
@pytest.mark.parametrize(("name", "plain"), [("tanh", mx.tanh), ("silu", nn.silu)])
def test_other_dtypes_run_the_mlx_op(name: str, plain: object) -> None:
    x = mx.array(np.linspace(-4.0, 4.0, 33), mx.float16)
    y = getattr(activations, name)(x)
    assert y.dtype == mx.float16
    np.testing.assert_array_equal(np.array(y), np.array(plain(x)))
