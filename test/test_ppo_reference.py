"""One PPO update checked against independent implementations.

A hand-written float64 numpy PPO (forward and backward of the MLPs with ELU, Gaussian
log-prob, clipped surrogate, clipped value loss, entropy, global-norm clipping,
PyTorch-style Adam) must give the parameters the MLX trainer gives, on the very
mini-batches it saw. Where the bench dependencies are installed, rsl_rl's PPO must
too. Also: the fast ELU against float64, compiled against eager updates, and the
fallback when MLX cannot compile.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.rl.activations import elu, expm1_nonpositive
from unilab_ros.rl.buffer import TERMINATED, RolloutBuffer
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.ppo import PPOTrainer
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

OBS_DIM, ACTION_DIM = 3, 2
NUM_ENVS, NUM_STEPS = 6, 8
HIDDEN = [16, 8]
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def make_model(seed: int = 0) -> MLPActorCritic:
    mx.random.seed(seed)
    cfg = ModelConfig(
        actor_hidden_dims=HIDDEN,
        critic_hidden_dims=HIDDEN,
        activation="elu",
        init_noise_std=0.8,
        normalize_observations=False,
    )
    model = MLPActorCritic(OBS_DIM, ACTION_DIM, cfg)
    # Larger output layers than the 0.01-gain init, so the policy gradient matters.
    rng = np.random.default_rng(seed)
    for net in (model.actor, model.critic):
        last = net.layers[-1]
        last.weight = mx.array(rng.normal(0.0, 0.5, last.weight.shape).astype(np.float32))
    mx.eval(model.parameters())
    return model


def filled_buffer(model: MLPActorCritic, seed: int = 0) -> RolloutBuffer:
    """A rollout whose old policy and values are off the model's, so every clip is active."""
    rng = np.random.default_rng(seed)
    buffer = RolloutBuffer(NUM_STEPS, NUM_ENVS, OBS_DIM, ACTION_DIM, gamma=0.99, lam=0.95)
    obs = rng.normal(0.0, 1.5, (NUM_STEPS, NUM_ENVS, OBS_DIM)).astype(np.float32)
    flat = mx.array(obs.reshape(-1, OBS_DIM))
    mean, std, log_std = model.distribution_params(flat)
    actions = mean + std * mx.array(rng.normal(size=mean.shape).astype(np.float32))
    log_probs = diag_gaussian_log_prob(actions, mean, log_std)
    values = model.value(flat)
    for t in range(NUM_STEPS):
        rows = slice(t * NUM_ENVS, (t + 1) * NUM_ENVS)
        dones = np.where(rng.random(NUM_ENVS) < 0.15, TERMINATED, 0)
        buffer.add(obs=obs[t], actions=np.array(actions[rows]),
                   rewards=rng.normal(size=NUM_ENVS), dones=dones)
    shape = (NUM_STEPS, NUM_ENVS)
    buffer.set_policy_outputs(
        np.array(log_probs).reshape(shape) + rng.normal(0.0, 0.3, shape),
        np.array(mean).reshape(*shape, ACTION_DIM),
        np.array(std).reshape(*shape, ACTION_DIM),
        np.array(values).reshape(shape) + rng.normal(0.0, 0.3, shape),
    )
    buffer.compute_returns_and_advantages(rng.normal(size=NUM_ENVS))
    return buffer


def record_batches(buffer: RolloutBuffer) -> list[dict[str, np.ndarray]]:
    """Make ``buffer`` remember the mini-batches it serves, in order."""
    seen: list[dict[str, np.ndarray]] = []
    generate = buffer.mini_batch_generator

    def recording(*args: Any, **kwargs: Any):
        for batch in generate(*args, **kwargs):
            seen.append({key: np.array(value, np.float64)
                         for key, value in batch._asdict().items()})
            yield batch

    buffer.mini_batch_generator = recording  # type: ignore[method-assign]
    return seen


def normalized_advantages(raw: np.ndarray) -> np.ndarray:
    """The trainer's normalization of a first rollout, once over all of it, in float64
    (no earlier rollout, so no std floor)."""
    raw = np.asarray(raw, np.float64)
    return (raw - raw.mean()) / (raw.std() + 1e-8)


def sample_indices(buffer: RolloutBuffer, batch: dict[str, np.ndarray]) -> np.ndarray:
    """Each mini-batch row's flat index in the rollout, found by its (unique) observation."""
    flat = buffer.observations.reshape(-1, OBS_DIM).astype(np.float64)
    return np.array([np.flatnonzero(np.all(flat == row, axis=1))[0] for row in batch["obs"]])


def params_of(model: MLPActorCritic) -> dict[str, np.ndarray]:
    return {name: np.array(value, np.float64)
            for name, value in tree_flatten(model.trainable_parameters())}


# ---- the numpy reference --------------------------------------------------------------


def mlp_forward(params: dict, prefix: str, x: np.ndarray) -> tuple[np.ndarray, list]:
    """Output and the (input, pre-activation, activation) of every hidden layer."""
    cache = []
    count = len(HIDDEN) + 1
    for index in range(count):
        weight, bias = params[f"{prefix}.layers.{index}.weight"], params[
            f"{prefix}.layers.{index}.bias"]
        z = x @ weight.T + bias
        if index == count - 1:
            return z, cache
        y = np.where(z > 0, z, np.expm1(np.minimum(z, 0.0)))
        cache.append((x, z))
        x = y
    raise AssertionError("unreachable")


def mlp_backward(params: dict, prefix: str, x_last: np.ndarray, cache: list,
                 d_out: np.ndarray, grads: dict) -> None:
    count = len(HIDDEN) + 1
    d = d_out
    inputs = [entry[0] for entry in cache] + [x_last]
    for index in reversed(range(count)):
        weight = params[f"{prefix}.layers.{index}.weight"]
        grads[f"{prefix}.layers.{index}.weight"] = d.T @ inputs[index]
        grads[f"{prefix}.layers.{index}.bias"] = d.sum(axis=0)
        if index == 0:
            return
        d = d @ weight
        z = cache[index - 1][1]
        d = d * np.where(z > 0, 1.0, np.exp(np.minimum(z, 0.0)))


def hidden_output(params: dict, prefix: str, obs: np.ndarray) -> np.ndarray:
    """The last hidden activation (the final linear layer's input)."""
    _, cache = mlp_forward(params, prefix, obs)
    z = cache[-1][1]
    return np.where(z > 0, z, np.expm1(np.minimum(z, 0.0)))


def reference_grads(params: dict, batch: dict, cfg: PPOConfig, min_std: float,
                    max_std: float) -> dict[str, np.ndarray]:
    """Gradients of the PPO loss of one mini-batch, derived by hand."""
    obs, actions = batch["obs"], batch["actions"]
    adv, returns, old_values = batch["advantages"], batch["returns"], batch["old_values"]
    size = len(obs)
    mean, actor_cache = mlp_forward(params, "actor", obs)
    value_out, critic_cache = mlp_forward(params, "critic", obs)
    values = value_out[:, 0]
    std_param = params["std"]
    std = np.clip(std_param, min_std, max_std)
    log_std = np.log(std)
    z = (actions - mean) / std
    log_probs = np.sum(-0.5 * z * z - log_std - LOG_SQRT_2PI, axis=-1)
    log_ratio = np.clip(log_probs - batch["old_log_probs"], -cfg.log_ratio_clip,
                        cfg.log_ratio_clip)
    ratio = np.exp(log_ratio)
    low, high = 1.0 - cfg.clip_param, 1.0 + cfg.clip_param
    # min(r A, clip(r) A) follows r A unless the clipped term is smaller and r is clipped.
    follows_ratio = (ratio * adv <= np.clip(ratio, low, high) * adv) | (
        (ratio > low) & (ratio < high))
    d_ratio = -adv * follows_ratio / size
    d_log_probs = d_ratio * ratio * (np.abs(log_probs - batch["old_log_probs"])
                                     < cfg.log_ratio_clip)
    d_mean = d_log_probs[:, None] * z / std
    # d log_prob / d log_std = z**2 - 1; the entropy term adds -entropy_coef per dim.
    d_log_std = np.sum(d_log_probs[:, None] * (z * z - 1.0), axis=0) - cfg.entropy_coef
    inside = (std_param >= min_std) & (std_param <= max_std)
    grads = {"std": d_log_std / std * inside}

    clipped_values = old_values + np.clip(values - old_values, -cfg.clip_param, cfg.clip_param)
    loss_plain, loss_clipped = (values - returns) ** 2, (clipped_values - returns) ** 2
    unclipped_in_range = np.abs(values - old_values) < cfg.clip_param
    d_values = np.where(loss_plain >= loss_clipped, 2.0 * (values - returns),
                        2.0 * (clipped_values - returns) * unclipped_in_range)
    d_values = cfg.value_loss_coef * d_values / size
    mlp_backward(params, "actor", hidden_output(params, "actor", obs), actor_cache,
                 d_mean, grads)
    mlp_backward(params, "critic", hidden_output(params, "critic", obs), critic_cache,
                 d_values[:, None], grads)
    return grads


def reference_update(params: dict, batches: list[dict], cfg: PPOConfig, min_std: float,
                     max_std: float) -> dict[str, np.ndarray]:
    """Clipped-gradient Adam steps (with bias correction, as torch.optim.Adam) per batch."""
    params = {key: value.copy() for key, value in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    m = {key: np.zeros_like(value) for key, value in params.items()}
    v = {key: np.zeros_like(value) for key, value in params.items()}
    for step, batch in enumerate(batches, start=1):
        grads = reference_grads(params, batch, cfg, min_std, max_std)
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        assert norm > cfg.max_grad_norm, "the test means to exercise gradient clipping"
        coef = min(1.0, cfg.max_grad_norm / (norm + 1e-6))
        for key, grad in grads.items():
            grad = grad * coef
            m[key] = beta1 * m[key] + (1.0 - beta1) * grad
            v[key] = beta2 * v[key] + (1.0 - beta2) * grad * grad
            m_hat = m[key] / (1.0 - beta1**step)
            v_hat = v[key] / (1.0 - beta2**step)
            params[key] = params[key] - cfg.learning_rate * m_hat / (np.sqrt(v_hat) + eps)
    return params


def reference_config(**overrides: Any) -> PPOConfig:
    fields: dict[str, Any] = {
        "num_learning_epochs": 2,
        "num_mini_batches": 3,
        "clip_param": 0.2,
        "value_loss_coef": 0.5,
        "entropy_coef": 0.01,
        "learning_rate": 3e-3,
        "use_clipped_value_loss": True,
        "max_grad_norm": 0.5,
        "schedule": "fixed",
    }
    return PPOConfig(**(fields | overrides))


def reference_runtime(enable_compile: bool = False) -> PPORuntimeConfig:
    """Eager steps unless asked, checked after every one."""
    return PPORuntimeConfig(enable_compile=enable_compile, finite_check_interval=1)


@pytest.mark.parametrize("enable_compile", [False, True])
def test_update_matches_the_numpy_reference(enable_compile: bool) -> None:
    model = make_model()
    buffer = filled_buffer(model)
    # The buffer holds raw GAE advantages; the reference normalizes them itself.
    advantages = normalized_advantages(buffer.advantages.reshape(-1))
    assert abs(float(np.std(buffer.advantages)) - 1.0) > 0.1
    batches = record_batches(buffer)
    before = params_of(model)
    cfg = reference_config()
    metrics = PPOTrainer(model, cfg, seed=5, runtime=reference_runtime(enable_compile)).update(
        buffer
    )
    assert metrics["updates_applied"] == 6.0 and len(batches) == 6
    for batch in batches:
        served = batch["advantages"]
        batch["advantages"] = advantages[sample_indices(buffer, batch)]
        np.testing.assert_allclose(served, batch["advantages"], rtol=0.0, atol=1e-5)
    # The test data exercises both the ratio clip and the value clip.
    assert 0.0 < metrics["clip_fraction"] < 1.0
    values = mlp_forward(before, "critic", batches[0]["obs"])[0][:, 0]
    value_moves = np.abs(values - batches[0]["old_values"])
    assert np.any(value_moves > cfg.clip_param) and np.any(value_moves < cfg.clip_param)
    expected = reference_update(before, batches, cfg, model.cfg.min_std, model.cfg.max_std)
    after = params_of(model)
    assert set(after) == set(expected)
    for name, value in expected.items():
        assert not np.allclose(value, before[name]), f"{name} did not move"
        np.testing.assert_allclose(after[name], value, rtol=0.0, atol=1e-5, err_msg=name)


def test_compiled_and_eager_updates_give_the_same_parameters() -> None:
    results = []
    for enable_compile in (False, True):
        model = make_model()
        cfg = reference_config(schedule="adaptive")
        runtime = reference_runtime(enable_compile)
        PPOTrainer(model, cfg, seed=7, runtime=runtime).update(filled_buffer(model))
        results.append(params_of(model))
    eager, compiled = results
    for name, value in eager.items():
        np.testing.assert_allclose(compiled[name], value, rtol=0.0, atol=1e-5, err_msg=name)


def test_compile_failure_is_logged_once_and_updates_run_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_compile(*_args: Any, **_kwargs: Any):
        raise RuntimeError("no C++ compiler")

    model = make_model()
    monkeypatch.setattr(mx, "compile", broken_compile)
    with caplog.at_level(logging.WARNING):
        trainer = PPOTrainer(model, reference_config(), runtime=reference_runtime(True))
        for seed in range(2):
            metrics = trainer.update(filled_buffer(model, seed=seed))
            assert metrics["updates_applied"] == 6.0
    assert "no C++ compiler" in (trainer.compile_error or "")
    warnings = [r for r in caplog.records if "compile" in r.getMessage()]
    assert len(warnings) == 1


def test_a_jit_failure_at_the_first_evaluation_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reference = make_model()
    eager = PPOTrainer(reference, reference_config(), runtime=reference_runtime())
    eager.update(filled_buffer(reference))
    model = make_model()
    buffer = filled_buffer(model)
    trainer = PPOTrainer(model, reference_config(), runtime=reference_runtime(True))
    evaluate = mx.eval
    calls = []

    def eval_failing_once(*args: Any) -> None:
        # MLX builds compiled kernels when first evaluated: that is where a JIT fails.
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("[Compile::eval_cpu] Failed to compile function")
        evaluate(*args)

    monkeypatch.setattr(mx, "eval", eval_failing_once)
    with caplog.at_level(logging.WARNING):
        metrics = trainer.update(buffer)
    assert metrics["updates_applied"] == 6.0
    assert "Failed to compile" in (trainer.compile_error or "")
    # The failed step was undone and redone eagerly: same result as an eager trainer.
    for name, value in params_of(reference).items():
        np.testing.assert_allclose(params_of(model)[name], value, atol=1e-5, err_msg=name)


# ---- the fast ELU -----------------------------------------------------------------


def negative_floats(stride: int = 37) -> np.ndarray:
    """Every ``stride``-th float32 from -0 down to -100 (~30M values)."""
    start, stop = np.float32(-0.0).view(np.uint32), np.float32(-100.0).view(np.uint32)
    return np.arange(start, stop, stride, dtype=np.uint32).view(np.float32)


def test_expm1_is_float32_accurate_over_the_whole_negative_range() -> None:
    x = negative_floats()
    expected = np.expm1(x.astype(np.float64))
    got = np.array(expm1_nonpositive(mx.array(x))).astype(np.float64)
    error = np.abs(got - expected)
    nonzero = expected != 0.0
    assert error.max() <= 5e-8
    assert (error[nonzero] / np.abs(expected[nonzero])).max() <= 1e-7


def test_elu_matches_nn_elu_in_value_and_gradient() -> None:
    x = mx.array(np.concatenate([negative_floats(stride=997), np.linspace(0, 50, 10001)])
                 .astype(np.float32))
    np.testing.assert_allclose(np.array(elu(x)), np.array(nn.elu(x)), rtol=0.0, atol=6e-8)
    ours = mx.grad(lambda v: mx.sum(elu(v)))(x)
    plain = mx.grad(lambda v: mx.sum(nn.elu(v)))(x)
    np.testing.assert_allclose(np.array(ours), np.array(plain), rtol=0.0, atol=6e-8)
    special = np.array(elu(mx.array([0.0, -0.0, 3.0, -1e30, float("nan")])))
    np.testing.assert_array_equal(special[:4], [0.0, 0.0, 3.0, -1.0])
    assert np.isnan(special[4])


# ---- rsl_rl's PPO -----------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["fixed", "adaptive"])
def test_update_matches_rsl_rl(schedule: str) -> None:
    torch = pytest.importorskip("torch", reason="bench dependency (make bench) not installed")
    pytest.importorskip("tensordict", reason="bench dependency (make bench) not installed")
    pytest.importorskip("rsl_rl.algorithms", reason="bench dependency (make bench) not installed")
    from rsl_rl.algorithms import PPO
    from rsl_rl.models import MLPModel
    from rsl_rl.storage import RolloutStorage
    from tensordict import TensorDict

    torch.set_num_threads(1)
    model = make_model()
    buffer = filled_buffer(model)
    # rsl_rl clips the actor's and the critic's gradients separately, ours globally:
    # a norm bound neither reaches keeps the comparison exact. One mini-batch per epoch
    # makes its shuffle irrelevant. Under the adaptive schedule both sides adapt the rate
    # on every mini-batch's KL, within rsl_rl's fixed bounds (our defaults).
    cfg = reference_config(num_mini_batches=1, max_grad_norm=1e6, schedule=schedule,
                           num_learning_epochs=4)
    params = params_of(model)

    obs = TensorDict({"policy": torch.zeros(NUM_ENVS, OBS_DIM)}, batch_size=[NUM_ENVS])
    groups = {"actor": ["policy"], "critic": ["policy"]}
    distribution = {"class_name": "GaussianDistribution", "init_std": 1.0}
    actor = MLPModel(obs, groups, "actor", ACTION_DIM, HIDDEN, "elu",
                     distribution_cfg=distribution)
    critic = MLPModel(obs, groups, "critic", 1, HIDDEN, "elu")
    with torch.no_grad():
        for prefix, net in (("actor", actor), ("critic", critic)):
            linears = [m for m in net.mlp if isinstance(m, torch.nn.Linear)]
            for index, linear in enumerate(linears):
                linear.weight.copy_(torch.tensor(params[f"{prefix}.layers.{index}.weight"]))
                linear.bias.copy_(torch.tensor(params[f"{prefix}.layers.{index}.bias"]))
        actor.distribution.std_param.copy_(torch.tensor(params["std"]))
    storage = RolloutStorage("rl", NUM_ENVS, NUM_STEPS, obs, [ACTION_DIM])
    algorithm = PPO(
        actor, critic, storage,
        num_learning_epochs=cfg.num_learning_epochs, num_mini_batches=1,
        clip_param=cfg.clip_param, gamma=cfg.gamma, lam=cfg.lam,
        value_loss_coef=cfg.value_loss_coef, entropy_coef=cfg.entropy_coef,
        learning_rate=cfg.learning_rate, max_grad_norm=cfg.max_grad_norm,
        use_clipped_value_loss=True, schedule=schedule, desired_kl=cfg.desired_kl,
    )

    def tensor(array: np.ndarray, *trailing: int):
        return torch.tensor(np.asarray(array, np.float32)).reshape(NUM_STEPS, NUM_ENVS,
                                                                   *trailing)

    storage.observations["policy"].copy_(tensor(buffer.observations, OBS_DIM))
    storage.actions.copy_(tensor(buffer.actions, ACTION_DIM))
    storage.values.copy_(tensor(buffer.values, 1))
    storage.actions_log_prob.copy_(tensor(buffer.log_probs, 1))
    # Same targets on both sides. rsl_rl normalizes advantages over the rollout in its
    # compute_returns (with the n-1 std), which is bypassed here: it gets the advantages
    # as our trainer normalizes them, once over the rollout with the n std.
    storage.returns.copy_(tensor(buffer.returns, 1))
    storage.advantages = tensor(normalized_advantages(buffer.advantages), 1)
    storage.distribution_params = (tensor(buffer.mean, ACTION_DIM),
                                   tensor(buffer.std, ACTION_DIM))
    storage.step = NUM_STEPS
    algorithm.update()

    trainer = PPOTrainer(model, cfg, runtime=reference_runtime())
    metrics = trainer.update(buffer)
    ours = params_of(model)
    assert trainer.learning_rate == pytest.approx(algorithm.learning_rate, rel=1e-5)
    if schedule == "adaptive":
        # The rate moved during the update, so the comparison covers the schedule.
        assert metrics["learning_rate_min"] != metrics["learning_rate_max"]
    theirs = {"std": actor.distribution.std_param.detach().numpy()}
    for prefix, net in (("actor", actor), ("critic", critic)):
        linears = [m for m in net.mlp if isinstance(m, torch.nn.Linear)]
        for index, linear in enumerate(linears):
            theirs[f"{prefix}.layers.{index}.weight"] = linear.weight.detach().numpy()
            theirs[f"{prefix}.layers.{index}.bias"] = linear.bias.detach().numpy()
    assert set(theirs) == set(ours)
    for name, value in theirs.items():
        assert not np.allclose(value, params[name]), f"{name} did not move"
        np.testing.assert_allclose(ours[name], value, rtol=0.0, atol=1e-5, err_msg=name)
